"""A random-init gemma-3-270m of the released shape, built offline: the long-context benchmark's second model.

The shape is the released ``config.json``'s (18 layers, d_model 640, 4 query heads sharing 1 key/value head of 256,
d_mlp 2048, a 262,144-token vocabulary, sliding window 512 on five layers of every six, context 32,768), read by
lens_heads' own loader for a Gemma 3 folder (:func:`lens_heads.models.hf_folder.hooked_config`), and checked against
TransformerLens's own gemma-3-270m config field by field (which keeps a context of 8,192 as its safe default). No
weights are downloaded: TransformerLens initialises them at random, as the timings and memory don't depend on them.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

GEMMA_3_270M = dict(  # google/gemma-3-270m's config.json
    hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1,
    head_dim=256, vocab_size=262_144, sliding_window=512, max_position_embeddings=32_768, query_pre_attn_scalar=256,
    rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", attn_logit_softcapping=None, final_logit_softcapping=None,
    rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
    layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3, bos_token_id=2,
)
NAME = "gemma-3-270m"


def gemma3_270m_config():
    """The ``HookedTransformerConfig`` lens_heads builds for a gemma-3-270m folder (context 32,768)."""
    from transformers import Gemma3TextConfig

    from lens_heads.models.hf_folder import hooked_config

    hf_config = Gemma3TextConfig(**GEMMA_3_270M, architectures=["Gemma3ForCausalLM"])
    return hooked_config(Path(NAME), hf_config, fold_ln=False, device="cpu", dtype=torch.float32)


def differences_from_transformer_lens(cfg) -> dict[str, tuple]:
    """The fields of TransformerLens's own gemma-3-270m config (its source's table) that ``cfg`` sets otherwise:
    ``{field: (cfg's, TransformerLens's)}``; the context is compared apart (TransformerLens's is a safe default)."""
    from lens_heads.models import tl_internals

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = tl_internals.hub_config_fields("google/gemma-3-270m")
    skip = {"n_ctx", "tokenizer_name", "quantization_method"}
    return {k: (getattr(cfg, k), v) for k, v in theirs.items() if k not in skip and getattr(cfg, k) != v}


def gemma3_270m(seed: int = 0):
    """A random-init HookedTransformer of gemma-3-270m's shape, its rotary tables shared per kind of layer (as a
    loaded folder's are), no tokenizer (token ids in, BOS id 2)."""
    from transformer_lens import HookedTransformer

    from lens_heads.models import tl_internals

    cfg = gemma3_270m_config()
    if differences := differences_from_transformer_lens(cfg):
        raise RuntimeError(f"the gemma-3-270m shape differs from TransformerLens's own config: {differences}")
    cfg.seed, cfg.init_weights, cfg.tokenizer_name = seed, True, None
    model = HookedTransformer(cfg, move_to_device=False)
    model.eval()
    tl_internals.share_rotary_tables(model)
    model.lens_heads_meta = {"name": NAME, "source": f"random init, seed {seed}", "weight_basis": "raw",
                             "dtype": "float32"}
    return model
