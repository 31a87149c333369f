"""Tiny random-weight Hugging Face folders of the paper's model families (Llama-3, Qwen2.5, OLMo-2) and of Qwen3,
Mistral, Gemma-2, Gemma-3 and GPT-2, and an independent reference computed on them in plain Hugging Face eager
attention (``test_families.py`` compares lens_heads, on either backend, with it).

The reference reads the Hugging Face modules only: attention probabilities from ``output_attentions``, values from
the value projection's output (grouped-query heads repeated to their query heads), head outputs from the output
projection's input (a forward pre-hook, which also zeroes heads), and computes the twelve scores of the paper from
them in float64, by the formulas written out here again (not by ``lens_heads.heads.scores``).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

VOCAB = 100
BOS, EOS, PAD = 1, 2, 0
# initializer_range 0.15 (not ~0.02): attention far from uniform and head norms far apart, so the scores differ
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64, initializer_range=0.15, bos_token_id=BOS, eos_token_id=EOS,
            pad_token_id=PAD)
LOCAL_GLOBAL = dict(sliding_window=4, layer_types=["sliding_attention", "full_attention"])  # windows < input lengths
FAMILIES: dict[str, tuple[str, dict]] = {  # name: (model_type, config), shaped like the released models, tiny
    # Llama-3.1/3.2: grouped-query, rope_theta 5e5 and llama3 rope scaling (an original context shorter than the
    # inputs here, so the scaling changes the rotation)
    "llama-3": ("llama", dict(BASE, num_key_value_heads=2, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8))),
    # Qwen2.5: q/k/v biases, grouped-query, tied embeddings (as its small sizes)
    "qwen2.5": ("qwen2", dict(BASE, num_key_value_heads=2, tie_word_embeddings=True,
                              rope_parameters=dict(rope_type="default", rope_theta=1e6))),
    # OLMo-2 (7B/13B): as many key/value heads as query heads, q/k norms over all heads, norms after each sublayer
    "olmo-2": ("olmo2", dict(BASE, rope_parameters=dict(rope_type="default", rope_theta=500000.0))),
    # Qwen3: per-head q/k norms, head_dim x heads != hidden size (as in Qwen3-0.6B)
    "qwen3": ("qwen3", dict(BASE, num_key_value_heads=2, head_dim=32)),
    # Mistral-7B-v0.1: a sliding window on every layer
    "mistral": ("mistral", dict(BASE, num_key_value_heads=2, head_dim=16, sliding_window=4)),
    # Gemma-2: local/global layers, attention and final logit soft-caps, query_pre_attn_scalar != head_dim
    "gemma-2": ("gemma2", dict(BASE, **LOCAL_GLOBAL, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24,
                               attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
    # Gemma-3: local/global layers with their own rope bases, per-head q/k norms
    "gemma-3": ("gemma3_text", dict(BASE, **LOCAL_GLOBAL, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24)),
    # Gemma-3 4B-27B: linear rope scaling on the global layers (factor 8), none on the local ones
    "gemma-3-linear-rope": ("gemma3_text", dict(BASE, **LOCAL_GLOBAL, num_key_value_heads=2, head_dim=32,
                                                query_pre_attn_scalar=24, rope_parameters=dict(
        sliding_attention=dict(rope_type="default", rope_theta=10000.0),
        full_attention=dict(rope_type="linear", factor=8.0, rope_theta=1e6)))),
    # OLMo-2 with grouped-query attention (not the 7B/13B of the paper): HookedTransformer refuses it, see REFUSED
    "olmo-2-gqa": ("olmo2", dict(BASE, num_key_value_heads=2, rope_parameters=dict(rope_type="default",
                                                                                  rope_theta=500000.0))),
    # GPT-2: LayerNorm and biases everywhere, learned positions, fused q/k/v projection
    "gpt-2": ("gpt2", dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64, initializer_range=0.15,
                           bos_token_id=BOS, eos_token_id=EOS)),
}
# (family, backend): what load_model raises instead. TransformerLens 3.9's OLMo-2 converter splits the key and value
# projections into as many heads as the queries, so lens_heads refuses an OLMo-2 with fewer, saying so.
REFUSED = {("olmo-2-gqa", "hooked"): (NotImplementedError, "OLMo-2 weights only with as many key/value heads as query")}
# Inputs of different lengths (the batch is padded), all longer than the sliding windows, each starting at BOS.
INPUTS = [[BOS, 17, 42, 5, 88, 23, 61, 9, 30, 77, 12], [BOS, 64, 3, 51, 19, 95, 40], [BOS, 8, 73, 26, 58, 33, 90, 14, 47]]


def family_configs(n_layers: int) -> dict[str, dict]:
    """Tiny sizes per Hugging Face ``model_type`` with ``n_layers`` layers (grouped-query attention and sliding
    windows where the family has them): the folders the loading and pruning tests build."""
    small = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=n_layers,
                 num_attention_heads=4, max_position_embeddings=64)
    windows = dict(sliding_window=4, query_pre_attn_scalar=16)
    return {
        "llama": dict(small, num_key_value_heads=2),
        "qwen2": dict(small, num_key_value_heads=2),
        "gpt2": dict(vocab_size=101, n_embd=64, n_layer=n_layers, n_head=4, n_positions=64),
        "gemma3_text": dict(small, num_key_value_heads=2, head_dim=16, **windows,
                            layer_types=(["sliding_attention", "full_attention"] * n_layers)[:n_layers]),
        "qwen3": dict(small, num_key_value_heads=2, head_dim=16),
        "mistral": dict(small, num_key_value_heads=2, head_dim=16),
        "olmo": dict(small),
        "olmo2": dict(small),
        "gemma": dict(small, num_key_value_heads=1, head_dim=16),
        "gemma2": dict(small, num_key_value_heads=2, head_dim=16, **windows),
        "gpt_neox": dict(small),
        "phi3": dict(small, num_key_value_heads=2, pad_token_id=0),
    }


def build_folder(family: str, folder: Path, *, config: dict | None = None, seed: int = 0, tokenizer=None) -> Path:
    """Save a tiny random ``family`` model (``config``: fields over its tiny ones) and a word-level tokenizer of
    ``VOCAB`` tokens ("t0".."t99") into ``folder`` (or ``tokenizer``, with the model's vocabulary its size). Norm
    weights and biases are moved away from their initial ones and 1/0, so a norm or bias that is dropped or
    misplaced changes every number."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    model_type, fields = FAMILIES[family]
    fields = {**fields, **(config or {})}
    if tokenizer is not None:
        fields.update({"vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
                       "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id})
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **fields))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or ".ln_" in name or name.endswith("bias"):
                p.add_(0.3 * torch.randn_like(p))
        if model_type.startswith("gemma"):
            # Gemma multiplies the (tied) embedding by sqrt(hidden size): undo that here, or each token's own
            # embedding outweighs what the attention adds and every greedy step repeats the last token
            hf.get_input_embeddings().weight.div_(hf.config.hidden_size ** 0.5)
    hf.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
        return folder
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB)}, unk_token=f"t{PAD}"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=f"t{BOS}", eos_token=f"t{EOS}",
                            pad_token=f"t{PAD}").save_pretrained(folder)
    return folder


def load_hf(folder: Path):
    """The folder's model in plain Hugging Face, float64, eager attention (which returns attention probabilities)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager").eval()


def _attention_parts(hf) -> list[tuple[torch.nn.Module, torch.nn.Module, slice | None]]:
    """Per layer: the module whose output holds the values (and which part of it), and the output projection."""
    if hf.config.model_type == "gpt2":  # c_attn returns [q | k | v]
        d = hf.config.n_embd
        return [(block.attn.c_attn, block.attn.c_proj, slice(2 * d, 3 * d)) for block in hf.transformer.h]
    return [(layer.self_attn.v_proj, layer.self_attn.o_proj, None) for layer in hf.model.layers]


def n_heads(hf) -> int:
    return hf.config.n_head if hf.config.model_type == "gpt2" else hf.config.num_attention_heads


@torch.no_grad()
def hf_forward(hf, ids: list[int], zero: dict[int, Tensor] | None = None) -> tuple[Tensor, list[dict[str, Tensor]]]:
    """Logits ``[pos, vocab]`` of one unpadded input, and per layer its attention ``pattern [head, q, k]``, values
    ``v [k, head, d]`` (key/value heads repeated to the query heads that read them) and head outputs
    ``z [q, head, d]`` before the output projection; ``zero[layer]``: Bool[head], heads whose output is replaced by
    zeros before the output projection (after ``z`` is read)."""
    zero = zero or {}
    H = n_heads(hf)
    acts: list[dict[str, Tensor]] = [{} for _ in _attention_parts(hf)]
    handles = []
    for layer, (v_module, o_module, part) in enumerate(_attention_parts(hf)):
        def keep_v(module, args, out, layer=layer, part=part):
            acts[layer]["v_flat"] = (out if part is None else out[..., part])[0]

        def keep_z(module, args, layer=layer):
            x = args[0]
            z = x[0].reshape(x.shape[1], H, -1)
            acts[layer]["z"] = z.clone()
            if layer in zero:
                z = z * ~zero[layer].to(z.device)[None, :, None]
                return (z.reshape(x.shape), *args[1:])
            return None

        handles += [v_module.register_forward_hook(keep_v), o_module.register_forward_pre_hook(keep_z)]
    try:
        out = hf(torch.tensor([ids]), output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    for layer, a in enumerate(acts):
        d = a["z"].shape[-1]
        v = a.pop("v_flat").reshape(len(ids), -1, d)  # [k, kv_head, d]
        a["v"] = v.repeat_interleave(H // v.shape[1], dim=1)  # query head h reads key/value head h // (H / kv)
        a["pattern"] = out.attentions[layer][0]
    return out.logits[0], acts


def reference_scores(pattern: Tensor, v: Tensor, z: Tensor) -> dict[str, Tensor]:
    """The twelve scores of every head of one layer on one unpadded input (so the first token is position 0 and the
    last is the last position), in float64, written out from the paper's definitions."""
    A, v, o = pattern.double(), v.double(), z.double()
    plogp = torch.where(A > 0, A * A.log(), torch.zeros_like(A))
    base = {
        "AWFT": A[:, :, 0].mean(1),  # mean over queries i of A[i, first]
        "AEQD": (-plogp.sum(-1)).mean(1),  # mean over queries of the entropy of A[i, :], nats
        "FTVVN": v[0].norm(dim=-1),  # |v_first|
        "AVVN": v.norm(dim=-1).mean(0),  # mean over keys of |v_j|
        "LTHON": o[-1].norm(dim=-1),  # |o_last|
        "AHON": o.norm(dim=-1).mean(0),  # mean over queries of |o_i|
    }
    ln = {f"{name} (LN)": x / x.mean() for name, x in base.items()}
    ln["LTHON (LN)"] = base["LTHON"] / base["AHON"].mean()  # the paper's exception: divided by the layer mean of AHON
    return {**base, **ln}


INACTIVE_SIDE = {"AWFT": ">"}  # every other score: a head is inactive below the threshold


def inactive(values: Tensor, name: str, threshold: float) -> Tensor:
    return values > threshold if INACTIVE_SIDE.get(name.split(" ")[0]) == ">" else values < threshold


@torch.no_grad()
def hf_threshold_zeroing(hf, ids: list[int], name: str, threshold: float) -> tuple[Tensor, Tensor, float]:
    """The paper's per-input zeroing in plain Hugging Face: layer by layer, the heads whose ``name`` score (computed on
    the stream already zeroed in the layers before) is on the inactive side of ``threshold`` are zeroed. A layer's
    own zeroing can't change its scores, so layer l is decided on a forward with layers < l zeroed. Returns the
    zeroed heads ``[layer, head]``, the logits under that zeroing, and the smallest relative distance of any
    score from the threshold (how far rounding would have to move a value to flip a decision)."""
    zero: dict[int, Tensor] = {}
    margin = float("inf")
    n_layers = len(_attention_parts(hf))
    for layer in range(n_layers):
        _, acts = hf_forward(hf, ids, zero)
        values = reference_scores(**acts[layer])[name]
        zero[layer] = inactive(values, name, threshold)
        margin = min(margin, float(((values - threshold).abs() / abs(threshold)).min()))
    logits, _ = hf_forward(hf, ids, zero)
    return torch.stack([zero[layer] for layer in range(n_layers)]), logits, margin


@torch.no_grad()
def hf_greedy(hf, ids: list[int], zero: dict[int, Tensor], n: int) -> tuple[list[int], float]:
    """``n`` greedy tokens after ``ids`` with the heads ``zero`` zeroed at every position, and the smallest gap
    between the best and the second-best logit over the steps."""
    new: list[int] = []
    gap = float("inf")
    for _ in range(n):
        logits, _ = hf_forward(hf, ids + new, zero)
        top = logits[-1].topk(2).values
        gap = min(gap, float(top[0] - top[1]))
        new.append(int(logits[-1].argmax()))
    return new, gap
