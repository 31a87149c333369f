"""The authors' GPT-2 as a HookedTransformer, against the same model written in plain PyTorch (nanoGPT-style)."""

import math

import einops
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from lens_heads import tiny_model
from lens_heads.growth.gpt2 import PADDED_VOCAB, GPT2Options, gpt2_config, gpt2_model
from lens_heads.growth.inherit import inherit
from lens_heads.training.config import TrainConfig
from lens_heads.training.corpus import TokenCorpus
from lens_heads.training.loop import train
from lens_heads.training.windows import batch_at

VOCAB, D, HEADS, LAYERS, CTX = 64, 32, 4, 3, 16


# ---------------------------------------------------------------- GPT-2 as the authors write it (bias=False)


class Block(nn.Module):
    def __init__(self, layer: int):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D, bias=False), nn.LayerNorm(D, bias=False)
        self.c_attn, self.c_proj = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, D, bias=False)
        self.c_fc, self.mlp_proj = nn.Linear(D, 4 * D, bias=False), nn.Linear(4 * D, D, bias=False)
        self.layer = layer

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(D, dim=2)
        q, k, v = (z.view(b, t, HEADS, D // HEADS).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D // HEADS) / (self.layer + 1)  # scaled by 1/(layer+1)
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + self.c_proj((att @ v).transpose(1, 2).reshape(b, t, D))
        h = self.c_fc(self.ln_2(x))
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)))
        return x + self.mlp_proj(h)


class PlainGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, D), nn.Embedding(CTX, D)
        self.h = nn.ModuleList(Block(layer) for layer in range(LAYERS))
        self.ln_f = nn.LayerNorm(D, bias=False)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def optimizer(self, lr, weight_decay):
        """nanoGPT's rule: Linear weights decay; Embedding and LayerNorm weights do not (lm_head is wte)."""
        decay = [m.weight for m in self.modules() if isinstance(m, nn.Linear) and m is not self.lm_head]
        rest = [self.wte.weight, self.wpe.weight] + [m.weight for m in self.modules() if isinstance(m, nn.LayerNorm)]
        assert len(decay) + len(rest) == len(list(self.parameters()))
        return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                  {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))


def copy_into_plain(model) -> PlainGPT:
    """Read the hooked model's tensors by hand into the plain layout (Linear weights are [out, in])."""
    plain = PlainGPT()
    p = dict(model.named_parameters())
    with torch.no_grad():
        plain.wte.weight.copy_(p["embed.W_E"])
        plain.wpe.weight.copy_(p["pos_embed.W_pos"])
        plain.ln_f.weight.copy_(p["ln_final.w"])
        for layer, block in enumerate(plain.h):
            b = f"blocks.{layer}."
            block.ln_1.weight.copy_(p[b + "ln1.w"])
            block.ln_2.weight.copy_(p[b + "ln2.w"])
            qkv = [einops.rearrange(p[b + f"attn.W_{x}"], "h m d -> (h d) m") for x in "QKV"]
            block.c_attn.weight.copy_(torch.cat(qkv))
            block.c_proj.weight.copy_(einops.rearrange(p[b + "attn.W_O"], "h d m -> m (h d)"))
            block.c_fc.weight.copy_(p[b + "mlp.W_in"].T)
            block.mlp_proj.weight.copy_(p[b + "mlp.W_out"].T)
    return plain


def hooked(seed=0, options=GPT2Options()):
    return gpt2_model(gpt2_config(LAYERS, d_model=D, n_heads=HEADS, n_ctx=CTX, d_vocab=VOCAB), seed=seed, options=options)


def lr_by_hand(step, cfg):
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / (cfg.steps - cfg.warmup_steps)
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * t)) / 2


# ---------------------------------------------------------------- tests


@pytest.mark.floats
def test_same_logits_at_init():
    model = hooked(seed=1)
    tokens = torch.randint(0, VOCAB, (3, CTX), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # two implementations of the same float32 forward: logits (up to ~0.6) ~2e-7 apart
        torch.testing.assert_close(model(tokens), copy_into_plain(model)(tokens), atol=1e-5, rtol=1e-4)


@pytest.mark.floats
def test_same_gradient_reaches_the_tied_embedding():
    model = hooked(seed=2)
    plain = copy_into_plain(model)
    tokens = torch.randint(0, VOCAB, (2, CTX + 1), generator=torch.Generator().manual_seed(1))
    for m in (model, plain):
        F.cross_entropy(m(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    names = dict(model.named_parameters())
    assert "unembed.W_U" not in names and "unembed.W_U" not in model.state_dict()
    assert model.unembed.W_U.data_ptr() == model.embed.W_E.data_ptr()  # one tensor, not a copy
    # the tied embedding's gradient sums the embedding's and the unembedding's, in another order: its entries are
    # 4e-6 to 0.15, rounded by ~3e-8
    torch.testing.assert_close(names["embed.W_E"].grad, plain.wte.weight.grad, atol=1e-6, rtol=1e-4)


@pytest.mark.floats
def test_same_weights_and_loss_after_adamw_steps():
    rng = np.random.default_rng(0)
    corpus = TokenCorpus(train=rng.integers(0, VOCAB, 4000).astype(np.uint16),
                         val=rng.integers(0, VOCAB, 500).astype(np.uint16))
    # a large rate and weight decay, so that a wrong decay group or schedule shows within five steps
    cfg = TrainConfig(steps=5, batch_size=4, seq_len=CTX, warmup_steps=2, lr=1e-2, min_lr=1e-3, weight_decay=0.5,
                      grad_clip=1.0, eval_every=0, log_every=1, seed=3)
    model = hooked(seed=4)
    plain = copy_into_plain(model)
    result = train(model, corpus, cfg, progress=False)

    opt = plain.optimizer(cfg.lr, cfg.weight_decay)
    losses = []
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_by_hand(step, cfg)
        windows = batch_at(corpus.train, step, 0, cfg)
        loss = F.cross_entropy(plain(windows[:, :-1]).flatten(0, 1), windows[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())

    # five AdamW steps from the same start: the two implementations' rounding (~1e-7 of the loss) carried along
    np.testing.assert_allclose([h["train_loss"] for h in result.history], losses, rtol=1e-5)
    tokens = torch.randint(0, VOCAB, (2, CTX), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), plain(tokens), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(model.embed.W_E, plain.wte.weight, atol=1e-5, rtol=1e-4)
    for name, p in model.named_parameters():  # biases stayed at zero, out of the optimiser
        if name.rsplit(".", 1)[-1] == "b" or name.rsplit(".", 1)[-1].startswith("b_"):
            assert not p.requires_grad and not p.any(), name


def test_residual_projections_init_scaled_by_depth():
    model = gpt2_model(gpt2_config(6, d_model=128, n_heads=4, n_ctx=64, d_vocab=500), seed=0)
    p = dict(model.named_parameters())
    for layer in range(6):
        for name in ("attn.W_O", "mlp.W_out"):
            assert p[f"blocks.{layer}.{name}"].std().item() == pytest.approx(0.02 / math.sqrt(12), rel=0.05)
        for name in ("attn.W_Q", "attn.W_K", "attn.W_V", "mlp.W_in"):
            assert p[f"blocks.{layer}.{name}"].std().item() == pytest.approx(0.02, rel=0.05)
    assert p["embed.W_E"].std().item() == pytest.approx(0.02, rel=0.05)
    assert model.blocks[5].attn.attn_scale == pytest.approx(math.sqrt(32) * 6)


def test_transformer_lens_options_stay_reachable():
    model = hooked(options=GPT2Options.transformer_lens())
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {"unembed.W_U", "unembed.b_U", "blocks.0.attn.b_Q", "ln_final.b"} <= names
    assert model.blocks[2].attn.attn_scale == pytest.approx(math.sqrt(D // HEADS))
    assert gpt2_config(2).d_vocab == PADDED_VOCAB == 50304


def test_inherit_refuses_a_model_that_is_not_gpt2_shaped():
    with pytest.raises(ValueError, match="not GPT-2-shaped.*normalization_type"):
        inherit(tiny_model("llama"), 1)
