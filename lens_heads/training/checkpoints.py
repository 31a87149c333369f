"""A training run's checkpoints: the weights and the optimizer state as safetensors (no pickle) beside JSON, each
checkpoint folder written complete or not at all."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor

from lens_heads.plumbing.io import atomic_write_bytes, atomic_write_json


def model_state_bytes(model: torch.nn.Module) -> bytes:
    """The model's weights (its state dict, on the CPU) as safetensors bytes. A tensor the model holds under several
    names (rotary tables shared by the layers of one kind, `lens_heads.models.tl_internals.share_rotary_tables`) is
    written once, under its first name: safetensors stores no aliases, and `load_model_state` fills the others."""
    state, seen = {}, set()
    for name, value in model.state_dict().items():
        if _storage(value) not in seen:
            seen.add(_storage(value))
            state[name] = value.detach().contiguous().cpu()
    return st_save(state)


def load_model_state(model: torch.nn.Module, path: Path) -> None:
    """Load the weights at ``path`` (written by `model_state_bytes`) into ``model``, in place. A name the file lacks
    must be an alias in ``model`` of a tensor it has (loading that tensor fills it); anything else is an error."""
    state = st_load(Path(path).read_bytes())
    missing, unexpected = model.load_state_dict(state, strict=False)
    own = model.state_dict()
    loaded = {_storage(own[name]) for name in state if name in own}
    lacking = [name for name in missing if _storage(own[name]) not in loaded]
    if lacking or unexpected:
        raise RuntimeError(f"{path} does not hold this model's weights: missing {lacking[:5]}, unexpected "
                           f"{unexpected[:5]} (was it written by another architecture or configuration?)")


def _storage(t: Tensor) -> tuple:
    """Where a tensor's values live (the same for every alias of one tensor)."""
    return (t.device.type, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))


def optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[bytes, dict]:
    """Optimizer state as safetensors bytes (the tensors) and a JSON-able dict (everything else); no pickle."""
    sd = optimizer.state_dict()
    tensors = {f"{i}.{k}": v.detach().contiguous().cpu() for i, s in sd["state"].items() for k, v in s.items()
               if isinstance(v, Tensor)}
    scalars = {f"{i}.{k}": v for i, s in sd["state"].items() for k, v in s.items() if not isinstance(v, Tensor)}
    return st_save(tensors), {"param_groups": sd["param_groups"], "scalars": scalars}


def load_optimizer_state(optimizer: torch.optim.Optimizer, tensors: bytes, info: dict) -> None:
    """Restore ``optimizer`` from what `optimizer_state` wrote: its tensors (safetensors bytes) and ``info``."""
    state: dict[int, dict] = {}
    for key, value in [*st_load(tensors).items(), *info["scalars"].items()]:
        i, name = key.split(".", 1)
        state.setdefault(int(i), {})[name] = value
    groups = [{**g, "betas": tuple(g["betas"])} for g in info["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def save_checkpoint(folder: Path, model, optimizer, state: dict) -> Path:
    """Write a complete checkpoint folder atomically (built beside it, then renamed): the weights, the optimizer
    state and the run's ``state`` (a JSON-able dict: step, tokens seen, history)."""
    folder = Path(folder)
    staging = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    opt_tensors, opt_info = optimizer_state(optimizer)
    atomic_write_bytes(staging / "model.safetensors", model_state_bytes(model))
    atomic_write_bytes(staging / "optimizer.safetensors", opt_tensors)
    atomic_write_json(staging / "optimizer.json", opt_info)
    atomic_write_json(staging / "state.json", state)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return folder


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The newest complete checkpoint folder of the run in ``out_dir`` (None before the first)."""
    folders = sorted(p for p in (Path(out_dir) / "checkpoints").glob("step_*") if not p.name.endswith(".tmp"))
    return folders[-1] if folders else None
