"""The TransformerLens internals lens_heads relies on, in one place, each checked against the parameters it was
written for.

The evaluator's fast paths replace the forwards of HookedTransformer's modules (TransformerLens 3.9) for a block of
forwards and call what those forwards call: fused attention and shared prefixes replace ``AbstractAttention.forward``
and call ``calculate_qkv_matrices``, ``apply_rotary``, ``rotate_every_two``, the rotary tables and the layer's
causal direction; packed weights replace ``Unembed.forward`` and ``GatedMLP.forward``; cached generation builds
TransformerLens's key/value cache and drops a batch's finished rows from it; loading a Hugging Face model into a HookedTransformer calls
``loading_from_pretrained``'s config, weight and name converters. The bridge (4.x) is stopped before its final norm by its
``StopAtLayerException``, and both backends' logits end in ``apply_softcap``. None of these is public API, so a
release may rename one or change its parameters without notice. :data:`INTERNALS` lists each with its parameters as
of :data:`CHECKED`; :func:`require` checks those a feature uses when the feature starts and raises
:class:`InternalsChanged`, naming each function that is missing or different, rather than let a replaced forward
compute something else (instance attributes, :data:`ATTRIBUTES`, are named where they are read). Under TransformerLens 4.x the HookedTransformer internals don't exist and nothing asks for
them (the bridge runs its own modules); this module imports there all the same.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

CHECKED = {3: "3.9", 4: "4.3"}  # per TransformerLens major: the release whose internals INTERNALS describes
SETUP = {3: "bash scripts/setup.sh", 4: "bash scripts/setup.sh --bridge"}  # how to install that release

FUSED_ATTENTION, PACKED_WEIGHTS, CACHED_GENERATION = "fused attention", "packed weights", "cached generation"
FINAL_LOGITS, BRIDGE_STOP = "final logits", "stopping the bridge before its final norm"
SHARED_ROTARY = "rotary tables shared across layers"
LOADING = "loading weights into a HookedTransformer"
FAST_BLOCKS = "fast blocks"


@dataclass(frozen=True)
class Internal:
    """One internal: where it lives (``module:Qualified.name``), its parameters in order (None: a class, only
    looked up), the TransformerLens majors that have it, and the features of lens_heads that use it."""

    where: str
    params: tuple[str, ...] | None
    majors: tuple[int, ...]
    features: tuple[str, ...]


_ATTENTION = "transformer_lens.components.abstract_attention:AbstractAttention"
_QKV = ("self", "query_input", "key_input", "value_input")
_LOADING = "transformer_lens.loading_from_pretrained"  # 3.9 only (removed in 4.0)
INTERNALS = {
    "Attention": Internal("transformer_lens.components:Attention", None, (3,), (FUSED_ATTENTION,)),
    "GroupedQueryAttention": Internal("transformer_lens.components:GroupedQueryAttention", None, (3,),
                                      (FUSED_ATTENTION,)),
    "Unembed": Internal("transformer_lens.components:Unembed", None, (3,), (PACKED_WEIGHTS,)),
    "TransformerBlock": Internal("transformer_lens.components:TransformerBlock", None, (3,), (FAST_BLOCKS,)),
    "TransformerBlock.forward": Internal(
        "transformer_lens.components:TransformerBlock.forward",
        ("self", "resid_pre", "shortformer_pos_embed", "past_kv_cache_entry", "attention_mask"), (3,), (FAST_BLOCKS,)),
    "RMSNorm": Internal("transformer_lens.components:RMSNorm", None, (3,), (FAST_BLOCKS,)),
    "RMSNormPre": Internal("transformer_lens.components:RMSNormPre", None, (3,), (FAST_BLOCKS,)),
    "LayerNorm": Internal("transformer_lens.components:LayerNorm", None, (3,), (FAST_BLOCKS,)),
    "LayerNormPre": Internal("transformer_lens.components:LayerNormPre", None, (3,), (FAST_BLOCKS,)),
    "POST_NORM_ARCHITECTURES": Internal("transformer_lens.utilities.architectures:POST_NORM_ARCHITECTURES", None,
                                        (3,), (FAST_BLOCKS,)),
    "GatedMLP": Internal("transformer_lens.components.mlps.gated_mlp:GatedMLP", None, (3,), (PACKED_WEIGHTS,)),
    "AbstractAttention.forward": Internal(
        f"{_ATTENTION}.forward", _QKV + ("past_kv_cache_entry", "additive_attention_mask", "attention_mask",
                                         "position_bias"), (3,), (FUSED_ATTENTION,)),
    "AbstractAttention.calculate_qkv_matrices": Internal(f"{_ATTENTION}.calculate_qkv_matrices", _QKV, (3,),
                                                         (FUSED_ATTENTION,)),
    "GroupedQueryAttention.calculate_qkv_matrices": Internal(
        "transformer_lens.components:GroupedQueryAttention.calculate_qkv_matrices", _QKV, (3,), (FUSED_ATTENTION,)),
    "AbstractAttention.apply_rotary": Internal(f"{_ATTENTION}.apply_rotary",
                                               ("self", "x", "past_kv_pos_offset", "attention_mask"), (3,),
                                               (FUSED_ATTENTION,)),
    "AbstractAttention.rotate_every_two": Internal(f"{_ATTENTION}.rotate_every_two", ("self", "x"), (3,),
                                                   (FUSED_ATTENTION,)),
    "AbstractAttention._extend_rotary_embeddings": Internal(f"{_ATTENTION}._extend_rotary_embeddings",
                                                            ("self", "new_size"), (3,), (SHARED_ROTARY, FUSED_ATTENTION)),
    "softcap_enabled": Internal("transformer_lens.utilities.activation_functions:softcap_enabled", ("cap",), (3, 4),
                                (FUSED_ATTENTION,)),
    "Unembed.forward": Internal("transformer_lens.components:Unembed.forward", ("self", "residual"), (3,),
                                (PACKED_WEIGHTS,)),
    "GatedMLP.forward": Internal("transformer_lens.components.mlps.gated_mlp:GatedMLP.forward", ("self", "x"), (3,),
                                 (PACKED_WEIGHTS,)),
    "HookedTransformerConfig.is_layer_norm_activation": Internal(
        "transformer_lens:HookedTransformerConfig.is_layer_norm_activation", ("self",), (3,), (PACKED_WEIGHTS,)),
    "TransformerLensKeyValueCache.init_cache": Internal(
        "transformer_lens.cache.key_value_cache:TransformerLensKeyValueCache.init_cache",
        ("cfg", "device", "batch_size"), (3,), (CACHED_GENERATION,)),
    "apply_softcap": Internal("transformer_lens.utilities:apply_softcap", ("x", "cap"), (3, 4), (FINAL_LOGITS,)),
    "StopAtLayerException": Internal("transformer_lens.model_bridge.exceptions:StopAtLayerException",
                                     ("layer_output",), (4,), (BRIDGE_STOP,)),
    "get_pretrained_state_dict": Internal(f"{_LOADING}:get_pretrained_state_dict",
                                          ("official_model_name", "cfg", "hf_model", "dtype", "kwargs"), (3,),
                                          (LOADING,)),
    "get_pretrained_model_config": Internal(
        f"{_LOADING}:get_pretrained_model_config",
        ("model_name", "hf_cfg", "checkpoint_index", "checkpoint_value", "fold_ln", "device", "n_devices",
         "default_prepend_bos", "dtype", "first_n_layers", "n_ctx", "kwargs"), (3,), (LOADING,)),
    "get_official_model_name": Internal(f"{_LOADING}:get_official_model_name", ("model_name",), (3,), (LOADING,)),
    "convert_hf_model_config": Internal(f"{_LOADING}:convert_hf_model_config", ("model_name", "kwargs"), (3,),
                                        (LOADING,)),
}
# Instance attributes set in the modules' __init__ (no signature to check): read only through the functions below,
# which name the attribute when it is gone.
ATTRIBUTES = {"AbstractAttention": ("_attention_dir_override", "rotary_sin", "rotary_cos", "attn_type"),
              "GatedMLP": ("act_fn",)}


class InternalsChanged(RuntimeError):
    """The installed TransformerLens lacks, or changed, an internal that a lens_heads feature relies on."""


def tl_version() -> str:
    """The installed TransformerLens version."""
    return importlib.metadata.version("transformer-lens")


def tl_major() -> int:
    """The installed TransformerLens major version (3 or 4)."""
    return int(tl_version().split(".")[0])


def load(where: str) -> Any:
    """The object at ``module:Qualified.name`` (ImportError or AttributeError where it is gone)."""
    module, _, qualname = where.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def check(name: str) -> str | None:
    """What is wrong with internal ``name`` (a key of :data:`INTERNALS`) in the installed TransformerLens: None
    when it is there with the expected parameters."""
    internal = INTERNALS[name]
    obj = _optional(name)
    if obj is None:
        return f"{name} ({internal.where}) is gone"
    if internal.params is None:
        return None
    found = tuple(inspect.signature(obj).parameters)
    if found != internal.params:
        return f"{name} takes ({', '.join(found)}), not ({', '.join(internal.params)})"
    return None


@functools.cache  # a success only (a refusal raises): the installed TransformerLens stays put in a process
def require(feature: str) -> None:
    """Refuse to run ``feature`` when an internal it uses is missing or changed in the installed TransformerLens."""
    major = tl_major()
    problems = [problem for name, internal in INTERNALS.items()
                if feature in internal.features and major in internal.majors and (problem := check(name))]
    if problems:
        raise InternalsChanged(_changed(feature, "; ".join(problems)))


def _changed(feature: str, what: str) -> str:
    major = tl_major() if tl_major() in CHECKED else 3
    return (f"lens_heads's {feature} relies on TransformerLens internals that TransformerLens {tl_version()} changed "
            f"({what}; lens_heads was checked against {CHECKED[major]}): install TransformerLens {CHECKED[major]} "
            f"({SETUP[major]})" + (", or evaluate with attention='eager'" if feature == FUSED_ATTENTION else ""))


def _attribute(module, name: str, feature: str) -> Any:
    try:
        return getattr(module, name)
    except AttributeError:
        raise InternalsChanged(_changed(feature, f"{type(module).__name__} has no {name}")) from None


def _get(name: str, feature: str) -> Any:
    """Internal ``name``, or :class:`InternalsChanged` naming it where it is gone."""
    obj = _optional(name)
    if obj is None:
        raise InternalsChanged(_changed(feature, f"{name} ({INTERNALS[name].where}) is gone"))
    return obj


def _optional(name: str) -> Any:
    """Internal ``name``, or None where the installed TransformerLens lacks it (4.x: HookedTransformer's modules;
    :func:`require` names it where a feature needs it)."""
    try:
        return load(INTERNALS[name].where)
    except (ImportError, AttributeError):
        return None


# ---------------------------------------------------------------- attention (fused attention, shared prefixes)

ATTENTION_CLASSES = (_optional("Attention"), _optional("GroupedQueryAttention"))  # the layers fused attention replaces
UNEMBED, GATED_MLP = _optional("Unembed"), _optional("GatedMLP")


def softcap_enabled(cap: float | None) -> bool:
    """Whether a soft-cap setting caps at all (TransformerLens's own test)."""
    return _get("softcap_enabled", FUSED_ATTENTION)(cap)


def eager_attention(attn, query_input, key_input, value_input, **kwargs) -> Float[Tensor, "batch pos d_model"]:
    """The layer's own (class) forward, for a layer whose instance forward is replaced."""
    return type(attn).forward(attn, query_input, key_input, value_input, **kwargs)


def qkv(attn, query_input, key_input, value_input) -> tuple[Tensor, Tensor, Tensor]:
    """The layer's queries ``[batch, pos, head, d_head]`` and keys/values ``[batch, pos, kv_head, d_head]``
    (fires ``hook_q``, ``hook_k``, ``hook_v``)."""
    return attn.calculate_qkv_matrices(query_input, key_input, value_input)


def rotary(attn, x: Float[Tensor, "batch pos head d_head"], attention_mask: Int[Tensor, "batch pos"] | None
           ) -> Float[Tensor, "batch pos head d_head"]:
    """The layer's rotary embedding of ``x`` from position 0 (left padding counted as the layer counts it)."""
    return attn.apply_rotary(x, 0, attention_mask)


def rotary_at(attn, x: Float[Tensor, "batch pos head d_head"], positions: Int[Tensor, "batch pos"]
              ) -> Float[Tensor, "batch pos head d_head"]:
    """The layer's rotary embedding (``apply_rotary``'s arithmetic) at explicit per-row positions."""
    cos_table = _attribute(attn, "rotary_cos", FUSED_ATTENTION)
    sin_table = _attribute(attn, "rotary_sin", FUSED_ATTENTION)
    needed = int(positions.max()) + 1 if positions.numel() else 0
    if needed > cos_table.shape[0]:  # the tables grow with the longest forward so far, as apply_rotary grows them
        extend_rotary(attn, min(attn.cfg.n_ctx, max(needed, 2 * cos_table.shape[0])))
        cos_table, sin_table = attn.rotary_cos, attn.rotary_sin
    rotary_dim = attn.cfg.rotary_dim
    x = x.to(sin_table.device)
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    positions = positions.clamp(max=cos_table.shape[0] - 1).to(cos_table.device)
    cos, sin = cos_table[positions, None, :], sin_table[positions, None, :]
    return torch.cat([x_rot * cos + attn.rotate_every_two(x_rot) * sin, x_pass], dim=-1)


def extend_rotary(attn, size: int) -> None:
    """Grow the layer's rotary tables to ``size`` positions, as ``apply_rotary`` grows them."""
    _get("AbstractAttention._extend_rotary_embeddings", FUSED_ATTENTION)(attn, size)


def window(attn) -> int | None:
    """The layer's sliding window in positions (a local layer: query i attends to keys i - window + 1 .. i), or
    None for a global layer."""
    return attn.cfg.window_size if _attribute(attn, "attn_type", FUSED_ATTENTION) == "local" else None


ROTARY_TABLES = ("rotary_sin", "rotary_cos")


def derived_buffer(name: str) -> bool:
    """Whether a state-dict name is a table computed from the config (rotary sin/cos) rather than a weight: its
    length follows the longest forward or `share_rotary_tables`, so copying weights between models skips it."""
    return name.rsplit(".", 1)[-1] in ROTARY_TABLES


def share_rotary_tables(model) -> int:
    """Give every attention layer rotary tables covering the model's whole context ``n_ctx``, one pair of tables per
    distinct kind of layer (TransformerLens keeps a pair per layer and grows it with the longest forward: at Gemma 3's
    32,768 positions x 256 dimensions, 64 MB per layer). The tables depend on the layer's kind only (local or
    global: its rotary base and scaling), never on its index, so sharing them changes no value. Returns how many
    pairs there are now (0: a model without rotary positions or with dynamic NTK, whose tables change per forward)."""
    cfg = model.cfg
    if cfg.positional_embedding_type != "rotary" or cfg.use_dynamic_ntk_rope:
        return 0
    require(SHARED_ROTARY)
    extend = _get("AbstractAttention._extend_rotary_embeddings", SHARED_ROTARY)
    tables: dict[str, tuple[Tensor, Tensor]] = {}
    for block in model.blocks:
        attn = block.attn
        kind = _attribute(attn, "attn_type", SHARED_ROTARY)
        if kind not in tables:
            if _attribute(attn, "rotary_cos", SHARED_ROTARY).shape[0] != cfg.n_ctx:
                extend(attn, cfg.n_ctx)
            tables[kind] = (attn.rotary_sin, attn.rotary_cos)
        attn.rotary_sin, attn.rotary_cos = tables[kind]  # registered buffers: the module keeps them as buffers
    return len(tables)


def causal(attn) -> bool:
    """Whether the layer attends causally (its own override, else its config's direction)."""
    return (_attribute(attn, "_attention_dir_override", FUSED_ATTENTION) or attn.cfg.attention_dir) == "causal"


# ---------------------------------------------------------------- fast blocks

TRANSFORMER_BLOCK = _optional("TransformerBlock")
RMS_NORMS = tuple(c for c in (_optional("RMSNorm"), _optional("RMSNormPre")) if c is not None)
NORMS = RMS_NORMS + tuple(c for c in (_optional("LayerNorm"), _optional("LayerNormPre")) if c is not None)


def post_norm_architectures() -> frozenset[str]:
    """The architectures whose TransformerLens blocks normalise after each sublayer (OLMo 2/3)."""
    return frozenset(_get("POST_NORM_ARCHITECTURES", FAST_BLOCKS))


# ---------------------------------------------------------------- packed weights


def is_plain_unembed(module) -> bool:
    """Whether ``module`` is TransformerLens's own ``Unembed`` (not a subclass)."""
    return UNEMBED is not None and type(module) is UNEMBED


def is_plain_gated_mlp(mlp) -> bool:
    """Whether ``mlp`` is TransformerLens's own ``GatedMLP`` (not a subclass) without a layer-norm activation."""
    return GATED_MLP is not None and type(mlp) is GATED_MLP and not mlp.cfg.is_layer_norm_activation()


def eager_forward(module, *args) -> Tensor:
    """The module's own (class) forward, for a module whose instance forward is replaced."""
    return type(module).forward(module, *args)


def activation(mlp):
    """The gated MLP's activation function."""
    return _attribute(mlp, "act_fn", PACKED_WEIGHTS)


# ---------------------------------------------------------------- generation, logits, the bridge's stop


def new_kv_cache(cfg, device, batch_size: int = 1):
    """An empty TransformerLens key/value cache for HookedTransformer's cached forward."""
    require(CACHED_GENERATION)
    return _get("TransformerLensKeyValueCache.init_cache", CACHED_GENERATION)(cfg, device, batch_size)


def keep_kv_rows(kv, rows: Int[Tensor, "k"]) -> None:
    """Keep only batch ``rows`` of TransformerLens's key/value cache ``kv`` (rows whose generation ended leave it):
    every layer's keys and values and the attention mask so far. The cache's dataclass fields are not public API,
    so each is read through :func:`_attribute`, which names a field a release has renamed."""
    for entry in _attribute(kv, "entries", CACHED_GENERATION):
        keys = _attribute(entry, "past_keys", CACHED_GENERATION)
        entry.past_keys = keys[rows.to(keys.device)]
        entry.past_values = _attribute(entry, "past_values", CACHED_GENERATION)[rows.to(keys.device)]
    mask = _attribute(kv, "previous_attention_mask", CACHED_GENERATION)
    kv.previous_attention_mask = mask[rows.to(mask.device)]


def apply_softcap(logits: Tensor, cap: float | None) -> Tensor:
    """The logits soft-capped as the model's own forward caps them (unchanged where ``cap`` is None)."""
    return _get("apply_softcap", FINAL_LOGITS)(logits, cap)


def stop_bridge(resid: Tensor):
    """Stop a TransformerBridge's forward here, returning ``resid`` (raised from a hook; TransformerLens 4.x)."""
    raise _get("StopAtLayerException", BRIDGE_STOP)(resid)


# ---------------------------------------------------------------- loading (HookedTransformer, TransformerLens 3.9)


def pretrained_state_dict(name: str, cfg, hf_model, dtype) -> dict[str, Tensor]:
    """The weights of the Hugging Face model ``hf_model`` converted to HookedTransformer's names (config ``cfg``)."""
    require(LOADING)
    return _get("get_pretrained_state_dict", LOADING)(name, cfg, hf_model, dtype=dtype)


def pretrained_model_config(name: str, *, hf_cfg: dict, fold_ln: bool, device, dtype):
    """The ``HookedTransformerConfig`` TransformerLens builds for model ``name`` from its Hugging Face config."""
    require(LOADING)
    return _get("get_pretrained_model_config", LOADING)(name, hf_cfg=hf_cfg, fold_ln=fold_ln, device=device,
                                                        dtype=dtype)


def official_model_name(name: str) -> str:
    """TransformerLens's official name for hub model ``name`` (ValueError where it knows none)."""
    require(LOADING)
    return _get("get_official_model_name", LOADING)(name)


def hub_config_fields(official_name: str) -> dict[str, Any]:
    """The config fields TransformerLens sets for hub model ``official_name`` (for the models it describes in its
    own source, such as google/gemma-3-270m, without reaching the hub)."""
    require(LOADING)
    return _get("convert_hf_model_config", LOADING)(official_name)
