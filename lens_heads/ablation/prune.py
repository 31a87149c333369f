"""Bake a static ablation into a Hugging Face model and export it: :func:`prune`.

What the hooks of :mod:`lens_heads.ablation.hooks` and :mod:`lens_heads.ablation.removed_layers` do at run time, written into
the weights of the Hugging Face model the lens_heads model was loaded from, so that plain ``transformers`` runs the
ablated model with no lens_heads installed:

- a removed head ``(l, h)``: its columns of layer ``l``'s attention output projection (``o_proj``; GPT-2's
  ``c_proj``, GPT-NeoX's ``dense``: the head's ``W_O[l, h]``) are zeroed. Under ``ablation="mean"`` its mean output
  ``means[l, h] @ W_O[l, h]`` is added to that projection's bias, which needs a family whose config can give the
  projection a bias (:data:`FAMILIES`); Qwen2, Mistral and Phi-3 can't and are refused.
- a layer's attention (``part="attention"``): its whole output projection, weight and bias, is zeroed, so the layer
  adds nothing from attention (a post-attention norm of zero is zero). Exact, but nothing is freed: the layer still
  computes its queries, keys, values and pattern, and keeps its KV cache. No config of these families can drop a
  layer's attention alone.
- a whole block (``part="block"``): the decoder layer is dropped from the stack, ``num_hidden_layers`` and the
  per-layer ``layer_types`` follow. Its parameters, compute and KV cache are gone.

Zeroed heads free no memory either: every layer of these configs has the same number of heads. The exported model
equals the hooked static ablation of the same heads and layers on the original model (``static_zeroing`` plus
``remove_layers``) to float32 rounding.

Only the raw weight basis is exported: a model loaded with ``processing=True`` (folded LayerNorm, centred weights)
has weights the checkpoint doesn't hold, and its head indices would be mapped onto a checkpoint they no longer
describe.
"""

from __future__ import annotations

import copy
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import einops
import torch
from jaxtyping import Float
from torch import Tensor

from lens_heads.ablation.hooks import ABLATIONS
from lens_heads.ablation.removed_layers import PARTS, check_layer_order, check_layers
from lens_heads.ablation.specs import LayerRemoval, StaticAblation
from lens_heads.models.embedded import EMBEDDED, embedded_model_folder
from lens_heads.models.loading import weight_basis
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.io import atomic_write_json

ALWAYS = "always"  # the output projection has a bias whatever the config says


@dataclass(frozen=True)
class Family:
    """Where a family keeps what pruning edits: the decoder layers (from the model's root), the attention output
    projection (inside a layer), and the config field that gives that projection a bias (:data:`ALWAYS`; None: no
    field can)."""

    layers: str
    out_proj: str
    bias_field: str | None


_LLAMA_LIKE = Family("model.layers", "self_attn.o_proj", "attention_bias")
FAMILIES: dict[str, Family] = {  # model_type -> Family
    "llama": _LLAMA_LIKE, "qwen3": _LLAMA_LIKE, "olmo": _LLAMA_LIKE, "olmo2": _LLAMA_LIKE, "gemma": _LLAMA_LIKE,
    "gemma2": _LLAMA_LIKE, "gemma3_text": _LLAMA_LIKE,
    "qwen2": Family("model.layers", "self_attn.o_proj", None),
    "mistral": Family("model.layers", "self_attn.o_proj", None),
    "phi3": Family("model.layers", "self_attn.o_proj", None),
    "gpt2": Family("transformer.h", "attn.c_proj", ALWAYS),
    "gpt_neox": Family("gpt_neox.layers", "attention.dense", "attention_bias"),
}
PER_LAYER_FIELDS = ("layer_types",)  # config lists with one entry per layer that pruning knows how to cut
RECORD = "lens_heads_prune.json"  # what was removed, written beside the weights


@dataclass
class PrunedModel:
    """A Hugging Face model with a static ablation baked in (``hf``, a ``transformers`` model ready to run), its
    tokenizer (None where the source folder has none) and what was removed, in the original model's numbering:
    ``heads`` zeroed (``ablation``), ``layers`` removed (their ``part``). ``kept_layers[i]`` is the original index
    of the exported model's layer ``i``."""

    hf: Any
    tokenizer: Any
    heads: tuple[tuple[int, int], ...]
    layers: tuple[int, ...]
    part: str
    ablation: str
    kept_layers: tuple[int, ...]
    source: str
    n_layers: int
    n_heads: int
    means: Tensor | None = field(default=None, repr=False)

    def record(self) -> dict:
        """What was removed, as JSON (written into the exported folder as ``lens_heads_prune.json``)."""
        return dict(source=self.source, heads=[list(h) for h in self.heads], layers=list(self.layers), part=self.part,
                    ablation=self.ablation, kept_layers=list(self.kept_layers), n_layers=self.n_layers,
                    n_heads=self.n_heads, freed=self.freed())

    def freed(self) -> str:
        """Which memory the export physically frees, in words (module docstring)."""
        blocks = len(self.layers) if self.part == "block" else 0
        return (f"{blocks} decoder layer(s) dropped (their parameters, compute and KV cache); zeroed heads"
                + (" and zeroed attention layers" if self.part == "attention" and self.layers else "")
                + " still compute and keep their KV cache")

    def hook_pairs(self, model) -> list:
        """The hooked ablation this export bakes in, on the original lens_heads ``model``: static zeroing of
        ``heads`` (under ``ablation``) and the removal of ``layers``, as TransformerLens hook pairs."""
        from lens_heads.ablation.hooks import static_zeroing
        from lens_heads.ablation.removed_layers import remove_layers

        hooks = static_zeroing(model, self.heads, ablation=self.ablation, means=self.means).hooks if self.heads else []
        return hooks + (remove_layers(model, self.layers, part=self.part).hooks if self.layers else [])

    def save(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write a Hugging Face folder (``config.json``, ``model.safetensors``, the tokenizer and
        ``lens_heads_prune.json``) that ``AutoModelForCausalLM.from_pretrained(path)`` loads with no lens_heads.
        A folder that exists and is not empty is refused unless ``overwrite=True`` (it is then replaced whole)."""
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise InputError(f"{path} exists and is not a folder: give a new folder to export into")
        if path.is_dir() and any(path.iterdir()) and not overwrite:
            raise InputError(f"{path} exists and is not empty: give a new folder, or overwrite=True to replace it")
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        self.hf.save_pretrained(tmp, safe_serialization=True)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(tmp)
        atomic_write_json(tmp / RECORD, self.record())
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
        return path


def prune(model, *, heads: Iterable[tuple[int, int]] = (), layers: Sequence[int] = (), part: str = "attention",
          ablation: str = "zero", means: Float[Tensor, "layer head d_head"] | None = None) -> PrunedModel:
    """The Hugging Face model behind ``model`` with ``heads`` (``(layer, head)`` pairs) removed under ``ablation``
    (``"zero"``, or ``"mean"`` with ``means`` from :func:`lens_heads.ablation.hooks.mean_z`) and ``layers`` removed
    (``part="attention"``: their attention output zeroed; ``"block"``: dropped from the stack), baked into the
    weights (module docstring). ``.save(folder)`` exports it.

    ``model``: a model from :func:`lens_heads.load_model` in the raw weight basis, loaded from the embedded model or
    a local Hugging Face folder, or such a folder's path. Indices are the original model's. The export is built on
    the CPU from the folder's weights and keeps the checkpoint's dtype, whatever dtype ``model`` was loaded in."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = source_folder(model)
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    family = _family(config)
    _check_options(ablation, part)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype="auto", use_safetensors=True, trust_remote_code=False)
    n_layers, n_heads = len(_get(hf, family.layers)), config.num_attention_heads
    heads, layers = _checked_removal(model, hf, family, heads=heads, layers=layers, ablation=ablation, means=means,
                                     n_layers=n_layers, n_heads=n_heads)
    removed_attention = set(layers) if part == "attention" else set()
    dropped = set(layers) if part == "block" else set()
    state, folded = _removed_state(hf, family, heads, removed_attention, dropped, ablation=ablation, means=means,
                                   n_heads=n_heads)
    kept = tuple(layer for layer in range(n_layers) if layer not in dropped)
    pruned = _pruned_model(hf, config, family, state, kept, folded=folded)
    return PrunedModel(hf=pruned, tokenizer=_tokenizer(folder), heads=heads, layers=tuple(layers), part=part,
                       ablation=ablation, kept_layers=kept, source=str(folder), n_layers=n_layers, n_heads=n_heads,
                       means=means)


def _check_options(ablation: str, part: str) -> None:
    """Refuse an ablation or a part prune does not know."""
    if ablation not in ABLATIONS:
        raise InputError(f"ablation must be one of {ABLATIONS}, got {ablation!r}")
    if part not in PARTS:
        raise InputError(f"part must be one of {PARTS}, got {part!r}")


def _checked_removal(model, hf, family: Family, *, heads, layers, ablation: str, means: Tensor | None,
                     n_layers: int, n_heads: int) -> tuple[tuple[tuple[int, int], ...], Sequence[int]]:
    """The heads and layers to remove, checked against the folder's model (and against ``model``'s weights where
    it is a loaded model), with ``means`` given exactly when the ablation needs them."""
    blocks = _get(hf, family.layers)
    layers = () if isinstance(layers, (list, tuple)) and not layers else check_layers(layers, n_layers)
    checked_heads = _check_heads(heads, n_layers, n_heads)
    if ablation == "mean" and means is None:
        raise InputError("ablation='mean' needs means=[layer, head, d_head]: compute them with "
                         "lens_heads.ablation.hooks.mean_z(model, calibration_inputs)")
    if ablation == "zero" and means is not None:
        raise InputError("means were given with ablation='zero': pass ablation='mean' to mean-ablate")
    if means is not None:
        d_head = _out_weight(_get(blocks[0], family.out_proj).weight, _get(blocks[0], family.out_proj)).shape[1]
        _check_means(means, n_layers, n_heads, d_head // n_heads)
    if not checked_heads and not layers:
        raise InputError("prune needs heads=[(layer, head), ...] or layers=[...] to remove")
    if not isinstance(model, (str, Path)):
        _check_same_weights(model, hf, family, n_layers, n_heads)
    return checked_heads, layers


def _removed_state(hf, family: Family, heads: tuple[tuple[int, int], ...], removed_attention: set[int],
                   dropped: set[int], *, ablation: str, means: Tensor | None,
                   n_heads: int) -> tuple[dict[str, Tensor], bool]:
    """A copy of ``hf``'s weights with the removed attention outputs and heads zeroed, and whether a head's mean
    output was folded into a bias; the dropped blocks are left for renumbering to leave out."""
    blocks = _get(hf, family.layers)
    state = {k: v.detach().clone() for k, v in hf.state_dict().items()}
    folded = False
    for layer in range(len(blocks)):
        if layer in dropped:
            continue
        prefix = f"{family.layers}.{layer}.{family.out_proj}"
        weight = _out_weight(state[f"{prefix}.weight"], _get(blocks[layer], family.out_proj))  # [d_model, head*d_head]
        if layer in removed_attention:
            weight.zero_()
            if f"{prefix}.bias" in state:
                state[f"{prefix}.bias"].zero_()
            continue
        chosen = [h for l, h in heads if l == layer]
        if not chosen:
            continue
        folded = _remove_heads(state, prefix, weight, chosen, ablation=ablation,
                               means=None if means is None else means[layer], n_heads=n_heads) or folded
    return state, folded


def _remove_heads(state: dict[str, Tensor], prefix: str, weight: Tensor, chosen: list[int], *, ablation: str,
                  means: Tensor | None, n_heads: int) -> bool:
    """Zero the ``chosen`` heads' columns of one layer's output weight (a view into ``state``), under mean ablation
    folding their mean outputs (``means``: that layer's ``[head, d_head]``) into the bias first; whether it did."""
    d_head = weight.shape[1] // n_heads
    columns = [slice(h * d_head, (h + 1) * d_head) for h in chosen]  # head h's W_O[layer, h], transposed
    folded = False
    if ablation == "mean":
        assert means is not None
        shift = torch.stack([weight[:, c].double() @ means[h].double() for h, c in zip(chosen, columns)])
        bias = state.get(f"{prefix}.bias")
        state[f"{prefix}.bias"] = (shift.sum(0) if bias is None else bias.double() + shift.sum(0)).to(weight.dtype)
        folded = True
    for c in columns:
        weight[:, c] = 0  # a slice of a view: writes into the state dict's tensor
    return folded


def _pruned_model(hf, config, family: Family, state: dict[str, Tensor], kept: tuple[int, ...], *, folded: bool):
    """The Hugging Face model of the ``kept`` layers holding ``state``, in ``hf``'s dtype and generation config."""
    from transformers import AutoModelForCausalLM

    new_config = _pruned_config(config, family, kept, bias=folded)
    state = _renumbered(state, family.layers, kept)
    pruned = AutoModelForCausalLM.from_config(new_config, dtype=hf.dtype, trust_remote_code=False)
    own = pruned.state_dict()
    for key in own.keys() - state.keys():  # biases a config switch added to the other projections: zero
        if not key.endswith("bias"):
            raise RuntimeError(f"the pruned model has a parameter {key} the source lacks")
        state[key] = torch.zeros_like(own[key])
    pruned.load_state_dict(state, strict=True)
    pruned.generation_config = copy.deepcopy(hf.generation_config)
    pruned.eval()
    return pruned


# ---------------------------------------------------------------- from the report and the sweep


def prune_arguments(*specs) -> dict:
    """``prune``'s keyword arguments from ablation specs: a resolved :class:`StaticAblation` gives ``heads`` and
    ``ablation``, a :class:`LayerRemoval` gives ``layers`` and ``part`` (at most one of each). Mean ablation still
    needs ``means=``: ``prune(model, **prune_arguments(spec), means=mean_z(model, data))``."""
    if not specs:
        raise InputError("prune_arguments takes at least one spec: a resolved StaticAblation (heads to bake in), a "
                         "LayerRemoval (layers to drop), or one of each")
    out: dict[str, Any] = {}
    for spec in specs:
        if isinstance(spec, StaticAblation):
            if spec.heads is None:
                raise InputError(f"{spec} has no heads yet: resolve it with a calibration first "
                                 "(spec.resolve(ScoreCalibration(scores)))")
            if "heads" in out:
                raise InputError("prune_arguments takes one StaticAblation: merge the head sets first")
            out.update(heads=spec.heads, ablation=spec.ablation)
        elif isinstance(spec, LayerRemoval):
            if "layers" in out:
                raise InputError("prune_arguments takes one LayerRemoval: remove one set of layers, of one part")
            out.update(layers=spec.layers, part=spec.part)
        else:
            raise InputError(f"prune_arguments takes StaticAblation and LayerRemoval specs, got {spec!r}: a "
                             "per-input or threshold ablation has no fixed head set to bake into weights")
    return out


def first_layers(order: Sequence[int], k: int, *, part: str = "block", label: str | None = None) -> LayerRemoval:
    """The first ``k`` layers of a layer ranking (``order``: every layer once, the first to remove first, e.g.
    ``LayerScores.order("Block Influence")``, lowest Block Influence first) as a :class:`LayerRemoval` spec, for
    :func:`prune_arguments` or a sweep."""
    order = check_layer_order(order, len(order))
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < len(order):
        raise InputError(f"k={k!r}: give a number of layers to remove from 1 to {len(order) - 1}")
    return LayerRemoval(layers=tuple(order[:k]), part=part, order=label)


# ---------------------------------------------------------------- where the weights come from


def source_folder(model) -> Path:
    """The Hugging Face folder ``model`` was loaded from (or ``model`` itself, a folder's path); what can't be
    exported is refused, saying how to load it instead."""
    if isinstance(model, (str, Path)):
        folder = Path(model)
        if not (folder / "config.json").exists():
            raise InputError(f"{folder} is not a Hugging Face model folder (no config.json)")
        return folder
    meta = getattr(model, "lens_heads_meta", None)
    if not isinstance(meta, dict):
        raise InputError("prune needs a model from lens_heads.load_model (or a Hugging Face folder's path): this one "
                         "says nothing about where its weights came from")
    basis = weight_basis(model)
    if not basis.startswith("raw"):
        raise InputError(f"the model is in the {basis} weight basis, whose weights differ from the checkpoint's: "
                         "load it with load_model(name, processing=False) to prune it")
    name, source = str(meta.get("name", "")), str(meta.get("source", ""))
    if name.lower() in EMBEDDED:
        return embedded_model_folder(name.lower())
    if source.startswith("local folder "):  # load_model writes the resolved folder there
        return Path(source.removeprefix("local folder "))
    raise InputError(f"the model {name!r} ({source or 'no source'}) was not loaded from a Hugging Face folder: "
                     "save its Hugging Face model with save_pretrained and load_model(folder), then prune that")


def _family(config) -> Family:
    family = FAMILIES.get(getattr(config, "model_type", ""))
    if family is None:
        raise InputError(f"prune knows where the attention output and the layers of {', '.join(sorted(FAMILIES))} "
                         f"models are, not of a {config.model_type!r} model")
    return family


def _check_heads(heads, n_layers: int, n_heads: int) -> tuple[tuple[int, int], ...]:
    if isinstance(heads, (str, bytes)) or not hasattr(heads, "__iter__"):
        raise InputError(f"heads takes (layer, head) pairs, got {heads!r}")
    out = []
    for pair in heads:
        try:
            layer, head = (int(x) for x in pair)
        except (TypeError, ValueError):
            raise InputError(f"heads: {pair!r} is not a (layer, head) pair") from None
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise InputError(f"head ({layer}, {head}) is outside the model's {n_layers} layers x {n_heads} heads")
        out.append((layer, head))
    return tuple(sorted(set(out)))


def _check_means(means: Tensor, n_layers: int, n_heads: int, d_head: int) -> None:
    if tuple(means.shape) != (n_layers, n_heads, d_head):
        raise InputError(f"means has shape {tuple(means.shape)}, expected [layer, head, d_head] = "
                         f"{(n_layers, n_heads, d_head)}: compute them with mean_z on this model")


def _check_same_weights(model, hf, family: Family, n_layers: int, n_heads: int) -> None:
    """The lens_heads model still holds the folder's attention output weights, head by head: else what is zeroed
    here is not what its hooks zeroed (weights edited after loading, or another folder)."""
    cfg = model.cfg
    if (cfg.n_layers, cfg.n_heads) != (n_layers, n_heads):
        raise InputError(f"the model has {cfg.n_layers} layers x {cfg.n_heads} heads but its folder holds "
                         f"{n_layers} x {n_heads}")
    W_O = getattr(model, "W_O", None)
    if W_O is None:
        return
    blocks = _get(hf, family.layers)
    for layer in range(n_layers):
        module = _get(blocks[layer], family.out_proj)
        theirs = einops.rearrange(_out_weight(module.weight.detach(), module), "m (h d) -> h d m", h=n_heads)
        if not torch.equal(theirs.to(W_O.dtype).cpu(), W_O[layer].detach().cpu()):
            raise InputError(f"the model's W_O of layer {layer} differs from its folder's {family.out_proj}: its "
                             "weights changed after loading; prune the folder the weights are saved in")


def _out_weight(weight: Tensor, module) -> Tensor:
    """The output projection's weight as [d_model, head x d_head] (a view: GPT-2's Conv1D stores it transposed)."""
    return weight if isinstance(module, torch.nn.Linear) else weight.T


def _get(module, path: str):
    for name in path.split("."):
        module = module[int(name)] if name.isdigit() else getattr(module, name)
    return module


def _pruned_config(config, family: Family, kept: tuple[int, ...], *, bias: bool):
    """The config of the pruned model: ``kept`` layers, per-layer lists cut alike, the output bias switched on where
    a mean was folded into it. A per-layer field pruning doesn't know is refused."""
    d = config.to_dict()
    n_layers = config.num_hidden_layers
    n_key = config.attribute_map.get("num_hidden_layers", "num_hidden_layers")
    unknown = [k for k, v in d.items() if isinstance(v, (list, tuple)) and len(v) == n_layers
               and k not in PER_LAYER_FIELDS and n_layers > 1]
    if unknown and len(kept) < n_layers:
        raise InputError(f"the config's {', '.join(unknown)} look per-layer (one entry per layer), and prune can't "
                         "tell how to cut them: remove heads only, or layers' attention (part='attention')")
    d[n_key] = len(kept)
    for key in PER_LAYER_FIELDS:
        if d.get(key) is not None:
            d[key] = [d[key][i] for i in kept]
    if bias and family.bias_field is None:
        raise InputError(f"ablation='mean' folds each head's mean output into the attention output bias, and a "
                         f"{config.model_type} config can't give that projection a bias: use ablation='zero'")
    if bias and family.bias_field != ALWAYS:
        d[family.bias_field] = True
    new = type(config).from_dict(d)
    for key in PER_LAYER_FIELDS:
        if d.get(key) is not None and list(getattr(new, key)) != d[key]:
            raise InputError(f"the pruned config's {key} came out as {getattr(new, key)}, not {d[key]}")
    return new


def _renumbered(state: dict[str, Tensor], layers_path: str, kept: tuple[int, ...]) -> dict[str, Tensor]:
    """The state dict with the kept layers numbered 0, 1, ... and the others dropped."""
    new_index = {old: new for new, old in enumerate(kept)}
    prefix = layers_path + "."
    out = {}
    for key, value in state.items():
        if not key.startswith(prefix):
            out[key] = value
            continue
        index, rest = key[len(prefix):].split(".", 1)
        if int(index) in new_index:
            out[f"{prefix}{new_index[int(index)]}.{rest}"] = value
    return out


def _tokenizer(folder: Path):
    from transformers import AutoTokenizer

    if not any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return None
    return AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
