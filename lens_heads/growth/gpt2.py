"""The GPT-2 that the Inheritune authors train (a nanoGPT fork), built as a HookedTransformer.

Their model differs from TransformerLens's default GPT-2 in five ways, each a field of `GPT2Options` (defaults:
theirs; ``GPT2Options.transformer_lens()``: TransformerLens's GPT-2):

- attention logits of layer l divided by (l + 1) on top of sqrt(d_head) (``scale_attn_by_inverse_layer_idx``);
- no biases in the linear layers, LayerNorms and LM head (``bias=False``). TransformerLens always has the bias
  tensors, so they stay at zero with ``requires_grad=False``: the optimiser never sees them;
- the token embedding and the unembedding are one tensor during training (``tie_embeddings``): ``unembed.W_U``
  is a view ``embed.W_E.T``, so the state dict and the optimiser hold ``embed.W_E`` only;
- the residual-output projections ``W_O`` and ``W_out`` drawn with std 0.02 / sqrt(2 n_layers), all other weight
  matrices and both embeddings with std 0.02 (``residual_init``);
- the vocabulary padded from 50257 to 50304 rows (``PADDED_VOCAB``, a multiple of 64), a `gpt2_config` argument.
"""

from __future__ import annotations

import contextlib
import math
import random
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor, nn
from transformer_lens.hook_points import HookPoint

from lens_heads.models.backends import hooked_transformer
from lens_heads.plumbing.errors import InputError

__all__ = [  # the namespace (lh.gpt2): its own names, not what it imports
    "GPT2Options", "gpt2_options", "gpt2_config", "gpt2_model", "TiedUnembed", "is_tied", "bias_names",
    "residual_output_names", "own_rng", "GPT2_VOCAB", "PADDED_VOCAB", "GPT2_SIZES",
]

if TYPE_CHECKING:  # TransformerLens 3.9 only
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.components import Embed

GPT2_VOCAB = 50257
PADDED_VOCAB = 50304  # GPT-2's 50257 rounded up to a multiple of 64, as the authors train

# GPT-2 sizes of the paper (the reference models it trains from scratch)
GPT2_SIZES = {"gpt2": dict(d_model=768, n_heads=12, n_layers=12), "gpt2-medium": dict(d_model=1024, n_heads=16, n_layers=24),
              "gpt2-large": dict(d_model=1280, n_heads=20, n_layers=36), "gpt2-xl": dict(d_model=1600, n_heads=25, n_layers=48)}


@dataclass(frozen=True)
class GPT2Options:
    """How a GPT-2 is built; the defaults are the Inheritune authors' (see the module docstring)."""

    scale_attn_by_inverse_layer_idx: bool = True
    bias: bool = False
    tie_embeddings: bool = True
    residual_init: bool = True

    @classmethod
    def transformer_lens(cls) -> GPT2Options:
        """TransformerLens's GPT-2: biases, separate W_E and W_U, every weight N(0, 0.02), no layer scaling."""
        return cls(scale_attn_by_inverse_layer_idx=False, bias=True, tie_embeddings=False, residual_init=False)

    def to_dict(self) -> dict:
        return asdict(self)


@contextlib.contextmanager
def own_rng():
    """TransformerLens seeds torch, numpy and random globally when a config has a seed: restore them after."""
    py, npy = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        yield
    random.setstate(py)
    np.random.set_state(npy)


def gpt2_config(n_layers: int, *, d_model: int = 768, n_heads: int = 12, n_ctx: int = 1024,
                d_vocab: int = PADDED_VOCAB, d_mlp: int | None = None, seed: int = 0) -> HookedTransformerConfig:
    """A GPT-2 architecture (pre-LayerNorm, learned positions, GELU MLP of width 4 d_model, init std 0.02)."""
    if d_model % n_heads:
        raise InputError(f"d_model={d_model} is not a multiple of n_heads={n_heads}")
    _, HookedTransformerConfig = hooked_transformer()
    with own_rng():
        return HookedTransformerConfig(
            n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=d_model // n_heads, n_ctx=n_ctx,
            d_mlp=d_mlp or 4 * d_model, d_vocab=d_vocab, act_fn="gelu_new", normalization_type="LN",
            positional_embedding_type="standard", init_mode="gpt2", initializer_range=0.02, seed=seed,
            default_prepend_bos=True, model_name=f"gpt2-{n_layers}L-{d_model}d",
        )


class TiedUnembed(nn.Module):
    """The unembedding as the transpose of the token embedding (one tensor, gradients from both uses)."""

    _embed: Embed

    def __init__(self, embed: Embed, b_U: nn.Parameter):
        super().__init__()
        object.__setattr__(self, "_embed", embed)  # not a submodule: W_E stays owned (and saved) by `embed` alone
        self.b_U = b_U
        self.hook_in, self.hook_out = HookPoint(), HookPoint()

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        return self._embed.W_E.T

    def forward(self, residual: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_vocab"]:
        residual = self.hook_in(residual)
        return self.hook_out(nn.functional.linear(residual, self._embed.W_E, self.b_U))


def is_tied(model: HookedTransformer) -> bool:
    """Whether ``model``'s unembedding is its token embedding (transposed), as the authors' GPT-2 ties them."""
    return isinstance(model.unembed, TiedUnembed)


def bias_names(model: HookedTransformer) -> list[str]:
    """Every bias tensor of a TransformerLens model: ``b_*`` of attention, MLP and unembedding, LayerNorm ``b``."""
    return [n for n, _ in model.named_parameters() if (last := n.rsplit(".", 1)[-1]) == "b" or last.startswith("b_")]


def residual_output_names(model: HookedTransformer) -> list[str]:
    """The projections that write into the residual stream: attention ``W_O`` and MLP ``W_out`` of every block."""
    return [n for n, _ in model.named_parameters() if n.endswith((".attn.W_O", ".mlp.W_out"))]


def gpt2_model(cfg: HookedTransformerConfig, *, seed: int, options: GPT2Options = GPT2Options(), tokenizer=None,
               device=None) -> HookedTransformer:
    """A freshly initialised GPT-2 HookedTransformer built with ``options``; the init depends on ``seed`` only
    (the global random generators are left as they were)."""
    HookedTransformer, HookedTransformerConfig = hooked_transformer()
    with own_rng():
        cfg = HookedTransformerConfig(**{**cfg.to_dict(), "seed": seed, "device": device or cfg.device,
                                         "scale_attn_by_inverse_layer_idx": options.scale_attn_by_inverse_layer_idx})
        model = HookedTransformer(cfg, tokenizer=tokenizer)  # W_* ~ N(0, 0.02), biases 0; seeds torch with `seed`
        if options.residual_init:
            std = 0.02 / math.sqrt(2 * cfg.n_layers)
            params = dict(model.named_parameters())
            with torch.no_grad():
                for name in residual_output_names(model):
                    params[name].normal_(0.0, std)
    if options.tie_embeddings:
        model.unembed = TiedUnembed(model.embed, model.unembed.b_U)
        model.setup()  # re-register the hook points under their names
    if not options.bias:
        params = dict(model.named_parameters())
        for name in bias_names(model):
            params[name].requires_grad_(False)  # already zero: TransformerLens initialises biases at 0
    model.gpt2_options = options
    model.eval()
    model.lens_heads_meta = {"name": cfg.model_name, "source": f"GPT-2 architecture, fresh init seed {seed}",
                             "weight_basis": "raw (no weight processing)", "dtype": str(cfg.dtype).replace("torch.", ""),
                             "gpt2_options": options.to_dict()}
    return model


def gpt2_options(model: HookedTransformer) -> GPT2Options:
    """The options a `gpt2_model` was built with; for another GPT-2-shaped HookedTransformer (LayerNorm, learned
    positions, plain MLP, full multi-head attention) the options its tensors show; an error for any other model."""
    options = getattr(model, "gpt2_options", None)
    if options is not None:
        return options
    c = model.cfg
    shape = {"normalization_type": (c.normalization_type, "LN"), "positional_embedding_type":
             (c.positional_embedding_type, "standard"), "gated_mlp": (c.gated_mlp, False),
             "n_key_value_heads": (c.n_key_value_heads, None)}
    wrong = {k: got for k, (got, want) in shape.items() if got != want}
    if wrong:
        raise InputError(f"{c.model_name} is not GPT-2-shaped ({wrong}; GPT-2 has "
                         f"{ {k: want for k, (_, want) in shape.items()} }). For a Llama-shaped model such as the "
                         "embedded SmolLM2 use lens_heads.growth.inheritune.inherit_first_layers")
    return GPT2Options(scale_attn_by_inverse_layer_idx=c.scale_attn_by_inverse_layer_idx, bias=True,
                       tie_embeddings=is_tied(model), residual_init=False)
