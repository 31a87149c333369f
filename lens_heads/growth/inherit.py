"""The initialisations that copy weights from a trained model: the students of Inheritune (Sanyal et al., arXiv
2404.08634), which take the potent early layers of a larger GPT-2, their growth, and the warm starts of the paper's
baselines (stacking, hybrid stacking, DistilBERT's evenly spaced blocks) beside a same-size fresh initialisation.

The student copies the reference's token embedding ``embed.W_E``, blocks ``0..n-1`` (attention, MLP, both
LayerNorms) and unembedding ``unembed.W_U``/``unembed.b_U``; the position embedding and the final LayerNorm stay
at fresh initialisation, as in the authors' code. (TransformerLens GPT-2 keeps W_E and W_U as separate tensors;
GPT-2 ties them. Both are copied, so a student starts with the reference's tie or lack of it.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from lens_heads.growth.gpt2 import GPT2Options, gpt2_model, gpt2_options, own_rng
from lens_heads.models import tl_internals
from lens_heads.models.backends import hooked_transformer
from lens_heads.plumbing.errors import InputError

if TYPE_CHECKING:  # TransformerLens 3.9 only
    from transformer_lens import HookedTransformer

BLOCK_PARTS = ("ln1", "ln2", "attn", "mlp")
# what "inheriting attention only / MLP only / both" copies of a block: each sub-layer with the LayerNorm before it
PARTS = {"both": BLOCK_PARTS, "attention": ("ln1", "attn"), "mlp": ("ln2", "mlp")}


def _check_gpt2(model: HookedTransformer, role: str) -> GPT2Options:
    try:
        return gpt2_options(model)
    except ValueError as err:
        raise InputError(f"the {role} must be GPT-2-shaped: {err}") from None


def _check_depth(n_layers: int, limit: int, what: str) -> None:
    if not 0 < n_layers <= limit:
        raise InputError(f"n_layers must be in 1..{limit} ({what}), got {n_layers}: a student cannot have more "
                         "layers than its reference")


def inherited_names(model: HookedTransformer, n_layers: int, *, parts: str = "both") -> list[str]:
    """State-dict names of ``model`` that a student of ``n_layers`` layers takes (layer by layer, ``parts`` of each
    block): the token embedding (with a tied model also its unembedding), the unembedding (``W_U``, ``b_U``) where
    it is a tensor of its own, and blocks ``0..n_layers-1``."""
    if parts not in PARTS:
        raise InputError(f"parts must be one of {sorted(PARTS)}, got {parts!r}")
    state = model.state_dict()
    names: list[str] = [k for k in ("embed.W_E", "unembed.W_U", "unembed.b_U") if k in state]
    names += [k for k in state for layer in range(n_layers)
              if any(k.startswith(f"blocks.{layer}.{part}.") for part in PARTS[parts])]
    return names


def _copy(target: HookedTransformer, source: HookedTransformer, names: list[str],
          rename=lambda name: name) -> None:
    """``target[name] = source[rename(name)]`` for each state-dict ``name`` that is a weight (rotary tables are
    computed from the config, and their lengths differ between a loaded reference and a fresh model)."""
    src, dst = source.state_dict(), target.state_dict()
    with torch.no_grad():
        for name in names:
            if not tl_internals.derived_buffer(name):
                dst[name].copy_(src[rename(name)])


def _block_from(mapping: dict[int, int]):
    """Rename ``blocks.{i}.x`` to ``blocks.{mapping[i]}.x`` (other names unchanged)."""
    def rename(name: str) -> str:
        if not name.startswith("blocks."):
            return name
        _, i, rest = name.split(".", 2)
        return f"blocks.{mapping[int(i)]}.{rest}"
    return rename


def _meta_of(model: HookedTransformer) -> dict:
    """The ``lens_heads_meta`` dict `gpt2_model` and `same_size_random` set on the model (not an nn.Module attribute
    mypy can see)."""
    return cast(dict, model.lens_heads_meta)


def _sized_like(model: HookedTransformer, n_layers: int, name: str, seed: int) -> HookedTransformer:
    _, HookedTransformerConfig = hooked_transformer()
    with own_rng():
        cfg = HookedTransformerConfig(**{**model.cfg.to_dict(), "n_layers": n_layers, "model_name": name})
    return gpt2_model(cfg, seed=seed, options=gpt2_options(model), tokenizer=model.tokenizer, device=model.cfg.device)


def inherit(reference: HookedTransformer, n_layers: int, *, seed: int = 0, layers: list[int] | None = None,
            parts: str = "both") -> HookedTransformer:
    """A GPT-2 student of ``n_layers`` layers: the reference's token embedding (and unembedding), its first
    ``n_layers`` blocks, with position embedding and final LayerNorm at fresh init (seed ``seed``), as the
    authors' code does. Built with the reference's `GPT2Options`.

    Ablations: ``layers`` picks the reference blocks that student blocks ``0..n-1`` take (default: the first n);
    ``parts="attention"`` / ``"mlp"`` copies only that sub-layer (with its LayerNorm) of each block.
    """
    _check_gpt2(reference, "reference")
    _check_depth(n_layers, reference.cfg.n_layers, "the reference's depth")
    layers = list(range(n_layers)) if layers is None else list(layers)
    if len(layers) != n_layers or not all(0 <= l < reference.cfg.n_layers for l in layers):
        raise InputError(f"layers must name {n_layers} reference blocks in 0..{reference.cfg.n_layers - 1}, got {layers}")
    student = _sized_like(reference, n_layers, f"inheritune-{n_layers}L-of-{reference.cfg.n_layers}L", seed)
    _copy(student, reference, inherited_names(student, n_layers, parts=parts), _block_from(dict(enumerate(layers))))
    _meta_of(student)["source"] = (f"Inheritune: {PARTS[parts]} of blocks {layers} (as blocks 0..{n_layers - 1}), "
                                   f"token embedding and unembedding of {reference.cfg.model_name}; "
                                   f"rest fresh init seed {seed}")
    return student


def inherit_later_layers(reference: HookedTransformer, n_layers: int, *, seed: int = 0) -> HookedTransformer:
    """Ablation: the student takes the reference's last ``n_layers`` blocks (the lazy ones) instead of the first."""
    _check_depth(n_layers, reference.cfg.n_layers, "the reference's depth")
    return inherit(reference, n_layers, seed=seed, layers=list(range(reference.cfg.n_layers - n_layers,
                                                                       reference.cfg.n_layers)))


def stack(source: HookedTransformer, n_layers: int, *, seed: int = 0) -> HookedTransformer:
    """Stacking baseline: a deeper model whose block i starts as the trained ``source`` block ``i % depth``
    (the shallow stack repeated), every other tensor (embeddings, final LayerNorm) taken from ``source``."""
    _check_gpt2(source, "source")
    depth = source.cfg.n_layers
    if n_layers <= depth:
        raise InputError(f"stacking grows a model: n_layers must exceed the source's {depth} layers, got {n_layers}")
    stacked = _sized_like(source, n_layers, f"stacked-{n_layers}L-of-{depth}L", seed)
    _copy(stacked, source, list(stacked.state_dict()), _block_from({i: i % depth for i in range(n_layers)}))
    _meta_of(stacked)["source"] = f"stacking: blocks 0..{depth - 1} of {source.cfg.model_name} repeated"
    return stacked


def hybrid_stack(source: HookedTransformer, n_layers: int, *, seed: int = 0) -> HookedTransformer:
    """Hybrid stacking baseline: a deeper model holding the trained ``source`` blocks once, spread evenly (block i
    at depth ``i * n_layers // depth``, so 0, 2, 4, ... when the depth doubles) with freshly initialised blocks
    (seed ``seed``) between them; embeddings and final LayerNorm from ``source``.

    Stacking (Gong et al. 2019, "Efficient training of BERT by progressively stacking"; `stack`) repeats every
    trained block. Sanyal et al. report a "hybrid stacking" warm start too, but their public code holds no script
    for it: this is lens_heads' definition (trained blocks stacked depth-wise with fresh blocks interleaved), not
    checked against theirs."""
    _check_gpt2(source, "source")
    depth = source.cfg.n_layers
    if not depth < n_layers <= 2 * depth:
        raise InputError(f"hybrid stacking adds at most one fresh block per trained one: n_layers must be in "
                         f"{depth + 1}..{2 * depth} for a {depth}-layer source, got {n_layers}")
    hybrid = _sized_like(source, n_layers, f"hybrid-stacked-{n_layers}L-of-{depth}L", seed)
    at = {i * n_layers // depth: i for i in range(depth)}  # target block <- source block
    names = [k for k in hybrid.state_dict() if not k.startswith("blocks.") or int(k.split(".")[1]) in at]
    _copy(hybrid, source, names, _block_from(at))
    _meta_of(hybrid)["source"] = (f"hybrid stacking: blocks 0..{depth - 1} of {source.cfg.model_name} at depths "
                                  f"{sorted(at)}, fresh blocks (seed {seed}) at the others")
    return hybrid


def distilbert_layers(ref_layers: int, n_layers: int) -> list[int]:
    """The reference blocks a DistilBERT-style student of ``n_layers`` takes: evenly spaced from the first to the
    last (every other one when the depth halves, up to rounding: 12 -> 6 gives 0, 2, 4, 7, 9, 11, the blocks
    DistilBERT and DistilGPT-2 were initialised from)."""
    _check_depth(n_layers, ref_layers, "the reference's depth")
    if n_layers == 1:
        return [0]
    return [int(x) for x in np.round(np.linspace(0, ref_layers - 1, n_layers))]


def distilbert_init(reference: HookedTransformer, n_layers: int, *, seed: int = 0) -> HookedTransformer:
    """A student initialised as DistilBERT was (Sanh et al. 2019): the reference's blocks `distilbert_layers`,
    and every other tensor of the reference too (token and position embeddings, final LayerNorm, unembedding)."""
    student = inherit(reference, n_layers, seed=seed, layers=distilbert_layers(reference.cfg.n_layers, n_layers))
    _copy(student, reference, [k for k in student.state_dict() if k.startswith(("pos_embed.", "ln_final."))])
    _meta_of(student)["source"] = (f"DistilBERT-style: blocks {distilbert_layers(reference.cfg.n_layers, n_layers)}"
                                   f", embeddings, final LayerNorm and unembedding of {reference.cfg.model_name}")
    return student


def same_size_random(reference: HookedTransformer, n_layers: int, *, seed: int = 0) -> HookedTransformer:
    """Any architecture: a fresh TransformerLens initialisation of ``reference``'s configuration at ``n_layers``
    layers (the same-size random-init baseline)."""
    _check_depth(n_layers, reference.cfg.n_layers, "the reference's depth")
    HookedTransformer, HookedTransformerConfig = hooked_transformer()
    with own_rng():
        # init_weights: a loaded pretrained model's config turns initialisation off (its weights are loaded)
        cfg = HookedTransformerConfig(**{**reference.cfg.to_dict(), "n_layers": n_layers, "seed": seed,
                                         "init_weights": True,
                                         "model_name": f"random-{n_layers}L-like-{reference.cfg.model_name}"})
        model = HookedTransformer(cfg, tokenizer=reference.tokenizer)
    model.eval()
    model.lens_heads_meta = {"name": cfg.model_name, "source": f"fresh init seed {seed} ({cfg.init_mode})",
                             "weight_basis": "raw (no weight processing)", "dtype": str(cfg.dtype).replace("torch.", "")}
    return model


def inherit_first_layers(reference: HookedTransformer, n_layers: int, *, seed: int = 0,
                         fresh: tuple[str, ...] = ("ln_final.",)) -> HookedTransformer:
    """Inheritune for any architecture (the Llama-shaped embedded SmolLM2 included; `inherit` is the GPT-2 one):
    ``reference``'s configuration at ``n_layers`` layers, taking every tensor of the token embedding, blocks
    ``0..n_layers-1`` and the unembedding; tensors whose names start with ``fresh`` (default: the final norm, as
    the authors' code leaves it) keep the fresh init of `same_size_random` with ``seed``."""
    student = same_size_random(reference, n_layers, seed=seed)
    student.cfg.model_name = f"inheritune-{n_layers}L-of-{reference.cfg.model_name}"
    _copy(student, reference, [k for k in student.state_dict() if not k.startswith(fresh)])
    _meta_of(student).update(name=student.cfg.model_name, source=(
        f"Inheritune: embedding, blocks 0..{n_layers - 1}, unembedding of {reference.cfg.model_name}; {fresh} "
        f"fresh init seed {seed}"), weight_basis=getattr(reference, "lens_heads_meta", {}).get("weight_basis", "raw"))
    return student


def grow(reference: HookedTransformer, n_layers: int, *, student: HookedTransformer | None = None,
         seed: int = 0) -> HookedTransformer:
    """A larger student of ``n_layers`` layers (at most the reference's depth).

    With ``student`` (the paper's recipe, `run_inheritune`'s default): keep the trained student (all its tensors)
    and append reference blocks ``student.n_layers..n_layers-1``. Without: a fresh re-inheritance of ``n_layers``
    reference layers (what the authors' logs fit).
    """
    _check_depth(n_layers, reference.cfg.n_layers, "growing cannot pass the reference's depth")
    grown = inherit(reference, n_layers, seed=seed)
    if student is not None:
        if student.cfg.n_layers >= n_layers:
            raise InputError(f"grow to {n_layers} layers needs a student with fewer layers, got {student.cfg.n_layers}")
        _copy(grown, student, [k for k in student.state_dict()])
        _meta_of(grown)["source"] += f"; blocks 0..{student.cfg.n_layers - 1} and embeddings from the trained student"
    return grown
