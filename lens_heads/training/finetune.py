"""A short supervised fine-tune of a Hugging Face causal language model on a task's solved items: the training loop
(`lens_heads.training.loop.train`) on `lens_heads.training.example_data.ExampleData` with the answer loss, under the
fine-tune's preset of the one config (`TrainConfig.finetune`: AdamW, linear warm-up then linear decay to zero,
gradient clipping, the held-out loss every ``eval_every`` steps).

The fine-tuned weights are written as a Hugging Face folder (safetensors, with the tokenizer and a ``finetune.json``
holding the settings and both loss curves), which ``lens_heads.load_model(folder)`` loads like any local model.
A folder that already holds the same fine-tune (same base, data and settings) is reused; one that holds another
is refused.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch

from lens_heads.plumbing.cache import canonical
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_json
from lens_heads.training.config import TrainConfig
from lens_heads.training.example_data import Example, ExampleData
from lens_heads.training.loop import train as train_loop

RECORD = "finetune.json"
# the preset's arguments: a stored fine-tune's key names these, and any other setting only where it is not the preset's
PRESET_ARGUMENTS = ("steps", "batch_size", "lr", "warmup_steps", "weight_decay", "grad_clip", "eval_every", "seed")


@dataclass
class FinetuneResult:
    """Where the fine-tuned model is, and how the run went."""

    folder: Path
    config: TrainConfig
    train_loss: list[float]  # per logged step (every step in the preset): the batch's mean answer-token loss
    eval_steps: list[int]
    eval_loss: list[float]  # the held-out loss after that many steps
    meta: dict = field(default_factory=dict)


def finetune(base_folder: str | Path, train_examples: Sequence[Example], held_out: Sequence[Example],
             out_dir: str | Path,
             cfg: TrainConfig | None = None, *, describe: dict | None = None,
             progress: bool = True) -> FinetuneResult:
    """Fine-tune the Hugging Face model in ``base_folder`` on ``train_examples``
    (`lens_heads.training.example_data.examples`)
    and write it to ``out_dir`` (module docstring). ``held_out``: examples the loss curve is measured on. ``cfg``:
    default `TrainConfig.finetune()`. ``describe``: what the data are (recorded with the run)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = cfg if cfg is not None else TrainConfig.finetune()
    if not train_examples or not held_out:
        raise InputError("finetune needs training examples and held-out examples")
    out = Path(out_dir)
    key = finetune_key(base_folder, train_examples, held_out, cfg)
    stored = _stored(out, key)
    if stored is not None:
        return stored
    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(base_folder)
    model = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    model.train()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    start = time.process_time()
    run = train_loop(model, ExampleData(train_examples, held_out, pad_id, describe or {}), cfg, progress=progress,
                     desc="fine-tune")
    evals = [(h["step"], h["val_loss"]) for h in run.history if "val_loss" in h]
    meta = dict(key=key, base=str(base_folder), n_train=len(train_examples), n_held_out=len(held_out),
                train_tokens_seen=run.tokens_seen, cpu_s=time.process_time() - start,
                threads=torch.get_num_threads(), data=describe or {}, loss=run.meta["objective"],
                schedule=f"AdamW, linear warm-up then {cfg.schedule} decay to {cfg.min_lr:g}, gradient norm clipped")
    result = FinetuneResult(out, cfg, [h["train_loss"] for h in run.history if "train_loss" in h],
                            [s for s, _ in evals], [v for _, v in evals], meta)
    _save(model.eval(), tokenizer, result)
    return result


def finetune_key(base_folder, train_examples: Sequence[Example], held_out: Sequence[Example], cfg: TrainConfig
                 ) -> dict:
    """What must match for a stored fine-tune to be reused: the base weights' file, the data and the settings (the
    preset's arguments, and any other setting where it is not the preset's)."""
    weights = Path(base_folder) / "model.safetensors"
    base = hashlib.sha256(weights.read_bytes()).hexdigest()[:16] if weights.exists() else str(base_folder)
    given = {k: getattr(cfg, k) for k in PRESET_ARGUMENTS}
    preset = asdict(TrainConfig.finetune(**given))
    config = given | {k: v for k, v in asdict(cfg).items() if k not in given and v != preset[k]}
    return canonical(dict(base=base, train=_digest(train_examples), held_out=_digest(held_out), config=config))


def _digest(data: Sequence[Example]) -> str:
    return hashlib.sha256(json.dumps([[list(e.tokens), e.first, list(e.answer)] for e in data]).encode()
                          ).hexdigest()[:16]


def _stored(out: Path, key: dict) -> FinetuneResult | None:
    record = out / RECORD
    if not record.exists():
        return None
    stored = json.loads(record.read_text())
    if stored.get("meta", {}).get("key") != key:
        raise InputError(f"{out} holds another fine-tune (other base, data or settings): pass a new out_dir, or "
                         "delete it to start over")
    config = stored["config"]  # written before the preset: its arguments only
    cfg = TrainConfig.finetune(**config) if set(config) <= set(PRESET_ARGUMENTS) else TrainConfig(**config)
    return FinetuneResult(out, cfg, stored["train_loss"], stored["eval_steps"], stored["eval_loss"], stored["meta"])


def _save(model, tokenizer, result: FinetuneResult) -> None:
    """The weights (safetensors), the tokenizer and the record, written beside ``folder`` and moved in at once."""
    out = result.folder
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    atomic_write_json(partial / RECORD, dict(config=asdict(result.config), train_loss=result.train_loss,
                                             eval_steps=result.eval_steps, eval_loss=result.eval_loss,
                                             meta=result.meta))
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)
