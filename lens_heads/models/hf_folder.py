"""The TransformerLens configuration of a local Hugging Face model folder, read from its ``config.json`` alone.

TransformerLens 3.9 knows some families (Gemma, Gemma 2, Gemma 3, OLMo, OLMo-2) only by their hub names, and takes
any path containing "llama" or "gemma" for a model of that family. Here the architecture comes from
``config.json`` (``architectures``, else ``model_type``) and the sizes from its fields, never from the folder's
name: TransformerLens converts the families it reads from a config through a link whose name says nothing, and the
name-only families are described below field by field.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from lens_heads.models import tl_internals
from lens_heads.plumbing.errors import InputError

if TYPE_CHECKING:  # TransformerLens 3.9 only
    from transformer_lens import HookedTransformerConfig

FAMILY_WORDS = ("llama", "gemma")  # words TransformerLens reads in a model path


def architecture(hf_config) -> str:
    """The model class ``config.json`` names (``architectures[0]``), else the causal-LM class of its
    ``model_type``."""
    names = getattr(hf_config, "architectures", None)
    if names:
        return names[0]
    found = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(hf_config, "model_type", ""))
    if found is None:
        raise InputError(f"config.json names no architecture and its model_type {hf_config.model_type!r} is not a "
                         "causal language model: save the model with save_pretrained")
    return found


def hooked_config(folder: Path, hf_config, *, fold_ln: bool, device, dtype) -> HookedTransformerConfig:
    """The ``HookedTransformerConfig`` of the model in ``folder`` (``hf_config``: its loaded ``config.json``)."""
    from transformer_lens import HookedTransformerConfig  # TransformerLens 3.9 (models.load_model checks)

    arch = architecture(hf_config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if arch not in NAME_ONLY:
            with _neutral_copy(hf_config, arch) as path:
                try:
                    cfg = tl_internals.pretrained_model_config(
                        str(path), hf_cfg=hf_config.to_dict(), fold_ln=fold_ln, device=device, dtype=dtype)
                except NotImplementedError:
                    raise NotImplementedError(
                        f"{folder} holds a {arch} (model_type {hf_config.model_type!r}), an architecture "
                        f"TransformerLens 3.9 can't build from a config; besides the ones it can, lens_heads reads "
                        f"{', '.join(NAME_ONLY)}") from None
            cfg.model_name, cfg.tokenizer_name = folder.name, str(folder)
            return cfg
        d = NAME_ONLY[arch](hf_config)
    d.update(original_architecture=arch, model_name=folder.name, tokenizer_name=str(folder), init_weights=False,
             device=device, n_devices=1, dtype=dtype, from_checkpoint=False, quantization_method=None)
    d.setdefault("default_prepend_bos", True)
    if fold_ln:
        d["normalization_type"] = {"LN": "LNPre", "RMS": "RMSPre"}.get(d["normalization_type"], d["normalization_type"])
    return HookedTransformerConfig.from_dict(d)


@contextlib.contextmanager
def _neutral_copy(hf_config, arch: str) -> Iterator[Path]:
    """A folder holding only the config (all TransformerLens reads to build its own), whose path has no word
    TransformerLens would take for a model family. Fields it reads that a recent transformers no longer saves are
    added under their older names."""
    d = hf_config.to_dict()
    d["architectures"] = [arch]
    if arch == "GPT2LMHeadModel":
        d.setdefault("n_ctx", d["n_positions"])
    with tempfile.TemporaryDirectory(prefix="lens-heads-") as tmp:
        path = Path(tmp) / "model"
        if any(word in str(path).lower() for word in FAMILY_WORDS):
            raise RuntimeError(f"the temporary folder {tmp} has {'/'.join(FAMILY_WORDS)} in its path, which "
                               "TransformerLens reads as a model name: set TMPDIR to another folder")
        path.mkdir()
        (path / "config.json").write_text(json.dumps(d))
        yield path


# ---------------------------------------------------------------- the families TransformerLens knows by name only


def _rope_parameters(c, layer_type: str | None = None) -> dict:
    params = getattr(c, "rope_parameters", None) or {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = params[layer_type]
    return params


def _rope_theta(c, layer_type: str | None = None, default: float = 10000.0,
                scalings: tuple[str | None, ...] = ("default", None)) -> float:
    params = _rope_parameters(c, layer_type)
    scaling = params.get("rope_type", "default")
    if scaling not in scalings:
        raise NotImplementedError(f"rope scaling {scaling!r} of this config is not supported by TransformerLens 3.9")
    return float(params.get("rope_theta", getattr(c, "rope_theta", default)))


def _common(c, *, d_head: int) -> dict:
    n_kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    return dict(d_model=c.hidden_size, d_head=d_head, n_heads=c.num_attention_heads,
                n_key_value_heads=n_kv if n_kv != c.num_attention_heads else None, d_mlp=c.intermediate_size,
                n_layers=c.num_hidden_layers, n_ctx=c.max_position_embeddings, d_vocab=c.vocab_size,
                initializer_range=c.initializer_range, positional_embedding_type="rotary", gated_mlp=True)


def _gemma_family(c) -> dict:
    d_head = c.head_dim
    act = getattr(c, "hidden_activation", None) or c.hidden_act
    d = dict(_common(c, d_head=d_head), eps=c.rms_norm_eps, act_fn=act, normalization_type="RMS", final_rms=True,
             use_attn_scale=True, rotary_dim=d_head)
    scalar = getattr(c, "query_pre_attn_scalar", None)
    if scalar is not None:
        d["attn_scale"] = math.sqrt(scalar)
    return d


def _local_global(c) -> dict:
    kinds = {"sliding_attention": "local", "full_attention": "global"}
    return dict(use_local_attn=True, window_size=c.sliding_window,
                attn_types=[kinds[t] for t in c.layer_types], use_normalization_before_and_after=True)


def _gemma(c) -> dict:
    return dict(_gemma_family(c), rotary_base=_rope_theta(c))


def _gemma2(c) -> dict:
    return dict(_gemma_family(c), **_local_global(c), rotary_base=_rope_theta(c),
                attn_scores_soft_cap=c.attn_logit_softcapping or -1.0,
                output_logits_soft_cap=c.final_logit_softcapping or -1.0)


def _gemma3(c) -> dict:
    d = dict(_gemma_family(c), **_local_global(c), use_qk_norm=True,
             rotary_base=_rope_theta(c, "full_attention", 1_000_000.0, ("default", None, "linear")),
             rotary_base_local=_rope_theta(c, "sliding_attention", 10_000.0))
    full = _rope_parameters(c, "full_attention")
    if full.get("rope_type") == "linear":  # Gemma 3 4B-27B: TransformerLens scales the global layers' positions only
        d["rotary_scaling_factor"] = float(full["factor"])
    if c.attn_logit_softcapping or c.final_logit_softcapping:
        d.update(attn_scores_soft_cap=c.attn_logit_softcapping or -1.0,
                 output_logits_soft_cap=c.final_logit_softcapping or -1.0)
    return d


def _olmo(c) -> dict:
    d_head = c.hidden_size // c.num_attention_heads
    return dict(_common(c, d_head=d_head), eps=1e-5, act_fn=c.hidden_act, normalization_type="LN",
                rotary_base=_rope_theta(c), rotary_dim=d_head, attn_types=["global"] * c.num_hidden_layers,
                clip_qkv=getattr(c, "clip_qkv", None))


def _olmo2(c) -> dict:
    if (getattr(c, "num_key_value_heads", None) or c.num_attention_heads) != c.num_attention_heads:
        raise NotImplementedError("TransformerLens 3.9 converts OLMo-2 weights only with as many key/value heads as "
                                  "query heads (as in the released OLMo-2 models)")
    d_head = c.hidden_size // c.num_attention_heads
    return dict(_common(c, d_head=d_head), eps=c.rms_norm_eps, act_fn=c.hidden_act, normalization_type="RMS",
                rotary_base=_rope_theta(c), rotary_dim=d_head, attn_types=["global"] * c.num_hidden_layers)


NAME_ONLY: dict[str, Callable[..., dict]] = {
    "GemmaForCausalLM": _gemma, "Gemma2ForCausalLM": _gemma2, "Gemma3ForCausalLM": _gemma3,
    "OlmoForCausalLM": _olmo, "Olmo2ForCausalLM": _olmo2,
}


def check_remote_code(folder: Path, ignore_remote_code: bool) -> None:
    """Refuse a folder whose ``config.json`` or ``tokenizer_config.json`` asks for its own code (``auto_map``, what
    ``trust_remote_code=True`` would run), unless ``ignore_remote_code``: lens_heads never runs a folder's code, and
    a model loaded as Transformers' own ``model_type`` instead may not be the model its authors wrote."""
    asked = {}
    for name in ("config.json", "tokenizer_config.json"):
        path = folder / name
        if path.exists():
            config = json.loads(path.read_text())
            if isinstance(config, dict) and config.get("auto_map"):
                asked[name] = config
    if not asked or ignore_remote_code:
        return
    maps = "; ".join(f"{name}: auto_map {sorted(config['auto_map'])}" for name, config in asked.items())
    model_type = asked.get("config.json", {}).get("model_type") or _model_type(folder)
    builtin = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    raise InputError(
        f"{folder} asks for remote code ({maps}): code shipped in a model folder runs with your permissions, and "
        "lens_heads never runs it (trust_remote_code=False). "
        + (f"Its model_type {model_type!r} is one Transformers implements itself: if the folder's code is only a "
           "copy of it, load the weights with that implementation, load_model(folder, ignore_remote_code=True), "
           "and check the model's outputs against the authors' (the folder's code is not run)" if builtin else
           f"Its model_type {model_type!r} is not one Transformers implements, so there is nothing to load it with: "
           "convert it to a Transformers architecture first"))


def _model_type(folder: Path) -> str | None:
    path = folder / "config.json"
    return json.loads(path.read_text()).get("model_type") if path.exists() else None
