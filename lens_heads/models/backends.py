"""The two TransformerLens backends, and the few calls in which they differ.

``"hooked"``: ``HookedTransformer`` (TransformerLens 3.9; the default where it is installed). ``"bridge"``:
``TransformerBridge`` (TransformerLens 4.x, which removed ``HookedTransformer``) over the Hugging Face model, with
raw weights. Both fire ``blocks.{l}.attn.hook_pattern`` ``[batch, head, query, key]``, ``hook_v``
``[batch, pos, kv_head, d_head]`` and ``hook_z`` ``[batch, pos, head, d_head]`` (before ``W_O``), and take
TransformerLens ``(hook_name, fn)`` pairs through ``model.hooks(...)``; the rest of lens_heads speaks only those.

What differs is decided here: which backends the installed TransformerLens has, and, per model, one
:class:`Backend` object (:func:`backend`) that says what lens_heads may do on it (fused attention and shared
prefixes, packed weights, forwards that start at a block) and runs what the backends do differently (a forward to
the residual stream after a block, the final logits, a key/value-cached generation step). Code outside this module
asks that object, never the model's type. TransformerLens internals are used through
:mod:`lens_heads.models.tl_internals` only.
"""

from __future__ import annotations

import abc
from collections import Counter
from typing import Callable, Sequence

from jaxtyping import Float, Int
from torch import Tensor

from lens_heads.models import tl_internals as tl
from lens_heads.models.tl_internals import tl_major, tl_version  # noqa: F401  (re-exported)
from lens_heads.plumbing.errors import InputError

BACKENDS = ("hooked", "bridge")
ATTENTION_HOOKS = ("hook_pattern", "hook_v", "hook_z")

try:  # 3.9
    from transformer_lens.utils import get_act_name  # noqa: F401  (re-exported)
except ImportError:  # 4.x
    from transformer_lens.utilities import get_act_name  # noqa: F401


def default_backend() -> str:
    """``"hooked"`` where TransformerLens 3.x is installed, else ``"bridge"``."""
    return "hooked" if tl_major() < 4 else "bridge"


def check_backend(backend: str | None) -> str:
    """The backend to load with (``None``: :func:`default_backend`); refuses one that is unknown or that the
    installed TransformerLens doesn't have."""
    if backend is None:
        return default_backend()
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}: choose one of {BACKENDS} (or leave it out: the installed "
                         f"TransformerLens {tl_version()} picks {default_backend()!r})")
    if backend == "hooked" and tl_major() >= 4:
        raise InputError(f"backend='hooked' needs HookedTransformer, which TransformerLens {tl_version()} no longer "
                         "has (4.0 replaced it by TransformerBridge): use backend='bridge', or install "
                         "TransformerLens 3.9 (pip install 'transformer-lens>=3.9,<4', or bash scripts/setup.sh)")
    if backend == "bridge" and tl_major() < 4:
        raise InputError(f"backend='bridge' needs TransformerLens 4.x (installed: {tl_version()}, whose "
                         "TransformerBridge is a beta without start/stop at a layer): use backend='hooked', or make "
                         "the 4.x environment with bash scripts/setup.sh --bridge")
    return backend


def is_bridge(model) -> bool:
    """Whether ``model`` is a ``TransformerBridge`` (else a ``HookedTransformer`` or a model built like one)."""
    return any(cls.__name__ == "TransformerBridge" for cls in type(model).__mro__)


def backend_of(model) -> str:
    """``"bridge"`` or ``"hooked"``."""
    return backend(model).name


def require_hooked(model, feature: str) -> None:
    """Refuse ``feature`` on a bridge model, saying it is HookedTransformer only."""
    if is_bridge(model):
        raise InputError(f"{feature} is HookedTransformer only: load the model with backend='hooked' "
                         "(TransformerLens 3.9)")


def hooked_transformer():
    """The ``HookedTransformer`` and ``HookedTransformerConfig`` classes (TransformerLens 3.9), or a clear error."""
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig  # 3.9 only: imported here
    except ImportError:
        raise ImportError(f"this needs HookedTransformer, which TransformerLens {tl_version()} no longer has: install "
                          "TransformerLens 3.9 (bash scripts/setup.sh) or use backend='bridge' where it is "
                          "supported (see the README's backend table)") from None
    return HookedTransformer, HookedTransformerConfig


def check_attention_hooks(model, names: Sequence[str] = ATTENTION_HOOKS, *, uses: str = "the head scores",
                          advice: Callable[[list[str]], str] | None = None) -> None:
    """Refuse a model whose first attention layer lacks one of ``names`` (``hook_pattern``, ``hook_v``,
    ``hook_z``), naming the hook, the architecture, and ``advice(missing)`` (what still works: the caller knows;
    :func:`lens_heads.heads.scores.what_still_works` for the scores). A model without a ``hook_dict`` is not a
    TransformerLens model and is left to fail where it is used."""
    hook_dict = getattr(model, "hook_dict", None)
    if hook_dict is None:
        return
    missing = [name for name in names if f"blocks.0.attn.{name}" not in hook_dict]
    if missing:
        arch = getattr(model.cfg, "architecture", None) or getattr(model.cfg, "original_architecture", None) \
            or type(model).__name__
        raise InputError(
            f"this {backend_of(model)} model ({arch}) has no {', '.join(f'blocks.0.attn.{m}' for m in missing)}, "
            f"needed for {uses}." + (f" {advice(missing)}" if advice else ""))


class Backend(abc.ABC):
    """What lens_heads may do on the models of one backend, and the calls in which the backends differ: the
    evaluation code asks a model's backend (:func:`backend`) rather than testing the model's type."""

    name: str
    fuses_attention: bool  # its attention layers may be swapped for lens_heads's fused SDPA (and shared prefixes)
    packs_weights: bool  # its unembedding and gated MLPs may run on weights laid out once per block of forwards
    starts_at_layer: bool  # a forward may start at a block (the evaluator's shared trunk)

    @abc.abstractmethod
    def run_to_resid(self, model, tokens: Tensor, attention_mask: Tensor | None, *, start: int | None = None,
                     stop: int) -> Tensor:
        """The forward of ``model`` (under the hooks already added) from the tokens (``start=None``) or from the
        residual stream ``tokens`` before block ``start``, to the residual stream before block ``stop``
        (``stop = n_layers``: after the last block, before the final norm)."""

    def final_logits(self, model, resid: Tensor) -> Tensor:
        """The residual stream after the last block to logits: final norm, unembedding, soft-cap (as both
        backends' own forward does)."""
        if getattr(model.cfg, "normalization_type", None) is not None:
            resid = model.ln_final(resid)
        return tl.apply_softcap(model.unembed(resid), getattr(model.cfg, "output_logits_soft_cap", None))

    def own_attention(self, model) -> str | None:
        """What attention ``model`` runs where lens_heads swaps none in, in words (None: lens_heads's fused or
        eager attention, which the evaluator counts)."""
        return None

    caches_batches: bool  # generation over a left-padded batch may run against a key/value cache (cached_step)

    @abc.abstractmethod
    def new_kv_cache(self, model, batch_size: int = 1):
        """An empty key/value cache for :meth:`cached_logits` (one row) or :meth:`cached_step` (``batch_size``)."""

    @abc.abstractmethod
    def cached_logits(self, model, ids: Tensor, kv) -> tuple[Tensor, object]:
        """The logits ``[d_vocab]`` after the last of ``ids`` (one row: only the tokens ``kv`` has not seen), run
        against the key/value cache ``kv``, and the cache updated."""

    def cached_step(self, model, ids: Int[Tensor, "batch new"], attention_mask: Int[Tensor, "batch new"],
                    kv) -> Float[Tensor, "batch d_vocab"]:
        """The logits after the last of ``ids`` in each row (left-padded: the last column is every row's last
        token), run against the key/value cache ``kv`` of the batch's earlier tokens, which takes the new keys,
        values and mask. Only where :attr:`caches_batches`."""
        raise InputError(f"the {self.name} backend does not run generation over a padded batch against a key/value "
                         "cache: generate without it (cache=False)")

    def keep_rows(self, kv, rows: Int[Tensor, "k"]) -> None:
        """Keep only batch ``rows`` of a :meth:`cached_step` cache (the others' generations ended)."""
        raise InputError(f"the {self.name} backend keeps no batch key/value cache")


class HookedBackend(Backend):
    """``HookedTransformer`` (TransformerLens 3.9): every fast path, and forwards from any block to any block."""

    name, fuses_attention, packs_weights, starts_at_layer = "hooked", True, True, True
    caches_batches = True

    def run_to_resid(self, model, tokens, attention_mask, *, start=None, stop):
        return model(tokens, attention_mask=attention_mask, start_at_layer=start, stop_at_layer=stop)

    def new_kv_cache(self, model, batch_size=1):
        return tl.new_kv_cache(model.cfg, model.cfg.device, batch_size)

    def cached_logits(self, model, ids, kv):
        resid = model(ids, stop_at_layer=model.cfg.n_layers, past_kv_cache=kv)
        return self.final_logits(model, resid[:, -1:])[0, -1], kv

    def cached_step(self, model, ids, attention_mask, kv):
        # TransformerLens appends the mask to the cache's and counts each position from the row's first real token
        # (cumsum of the whole mask): learned and rotary positions skip the left padding
        resid = model(ids, attention_mask=attention_mask, stop_at_layer=model.cfg.n_layers, past_kv_cache=kv)
        return self.final_logits(model, resid[:, -1:])[:, -1]

    def keep_rows(self, kv, rows):
        tl.keep_kv_rows(kv, rows)


class BridgeBackend(Backend):
    """``TransformerBridge`` (TransformerLens 4.x): it runs the Hugging Face modules (no attention or weights of
    TransformerLens's to swap), its ``start_at_layer`` still runs the blocks before it with any hooks on them (so
    lens_heads never starts it mid-way), and its forward returns logits (stopped by a hook at ``ln_final.hook_in``
    to read the residual stream after the last block)."""

    name, fuses_attention, packs_weights, starts_at_layer = "bridge", False, False, False
    caches_batches = False  # its cache is Hugging Face's, which lens_heads runs one row at a time

    def run_to_resid(self, model, tokens, attention_mask, *, start=None, stop):
        if start is not None:
            raise InputError("lens_heads never starts a TransformerBridge at a layer: its start_at_layer still runs "
                             "the blocks before it, hooks included")
        if stop < model.cfg.n_layers:
            return model(tokens, attention_mask=attention_mask, stop_at_layer=stop)

        def stop_before_final_norm(resid: Tensor, hook=None):
            tl.stop_bridge(resid)

        with model.hooks(fwd_hooks=[("ln_final.hook_in", stop_before_final_norm)]):
            return model(tokens, attention_mask=attention_mask)

    def own_attention(self, model):
        return bridge_attention(model)

    def new_kv_cache(self, model, batch_size=1):
        return None  # the first step starts one; Hugging Face's comes back from each step

    def cached_logits(self, model, ids, kv):
        logits, kv = model(ids, return_type="logits_and_cache", past_key_values=kv)
        return logits[0, -1], kv


HOOKED, BRIDGE = HookedBackend(), BridgeBackend()


def backend(model) -> Backend:
    """The backend of ``model``: what lens_heads may do on it, and how (a model built like a HookedTransformer is
    one)."""
    return BRIDGE if is_bridge(model) else HOOKED


def run_to_resid(model, tokens: Tensor, attention_mask: Tensor | None, *, start: int | None = None,
                 stop: int) -> Tensor:
    """:meth:`Backend.run_to_resid` of ``model``'s backend."""
    return backend(model).run_to_resid(model, tokens, attention_mask, start=start, stop=stop)


def final_logits(model, resid: Tensor) -> Tensor:
    """:meth:`Backend.final_logits` of ``model``'s backend."""
    return backend(model).final_logits(model, resid)


def bridge_attention(model) -> str:
    """What attention a TransformerBridge runs (lens_heads swaps in no fused attention there): its attention
    components, the Hugging Face attention modules they wrap, and the Hugging Face model's ``attn_implementation``
    (which the bridge sets to ``"eager"`` so that ``hook_pattern`` fires)."""
    kinds = Counter((type(block.attn).__name__, type(getattr(block.attn, "original_component", None)).__name__)
                    for block in model.blocks)
    config = getattr(getattr(model, "original_model", None), "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    layers = ", ".join(f"{bridge} over {hf} in {n} of {len(model.blocks)} layers" for (bridge, hf), n in kinds.items())
    return f"TransformerBridge attention: {layers}; Hugging Face attn_implementation={implementation!r}"
