"""Training throughput of the hooked GPT-2 (lens_heads.training.train) against a plain PyTorch GPT-2 of the same
architecture in the same process, and the cost of tracking attention rank during training.

    OMP_NUM_THREADS=2 python benchmarks/bench_train.py            # CPU defaults (a few minutes)
    python benchmarks/bench_train.py --device cuda --layers 12 --d-model 768 --batch 16 --seq 512

Targets: hooked >= 0.8x plain tokens/s; rank tracking <= 10% of training time. With --write, the figures go into
docs/records/benchmarks.md under "Training and rank tracking".
"""

from __future__ import annotations

import math
import platform
import statistics
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from lens_heads.collapse.rank_tracker import RankTracker
from lens_heads.growth.gpt2 import GPT2_VOCAB, GPT2Options, gpt2_config
from lens_heads.growth.gpt2 import gpt2_model as _gpt2_model
from lens_heads.plumbing.settings import option
from lens_heads.training.config import TrainConfig
from lens_heads.training.corpus import load_corpus
from lens_heads.training.loop import train
from lens_heads.training.schedules import lr_at
from lens_heads.training.windows import batch_at, eval_windows
from timing import (
    alternate,
    load_average,
    machine_line,
    parse_settings,
    repeated,
    rounds_option,
    timed,
    write_docs_option,
    write_section,
)

# the plain baseline below is TransformerLens's GPT-2 layout (biases, untied, 50257 tokens): the hooked model too
TL_LAYOUT = GPT2Options.transformer_lens()


def gpt2_model(cfg, **kw):
    return _gpt2_model(cfg, options=TL_LAYOUT, **kw)


# ---------------------------------------------------------------- the plain baseline (nanoGPT-style)


class Block(nn.Module):
    def __init__(self, d: int, n_heads: int, sdpa: bool):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.n_heads, self.sdpa = n_heads, sdpa

    def attention(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # written out, as TransformerLens computes it
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            y = scores.softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, d))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class PlainGPT2(nn.Module):
    """GPT-2 as TransformerLens builds it: learned positions, pre-LN, GELU (tanh), untied embedding/unembedding."""

    def __init__(self, n_layers, d, n_heads, n_ctx, vocab, sdpa=True):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(n_ctx, d)
        self.blocks = nn.ModuleList(Block(d, n_heads, sdpa) for _ in range(n_layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def plain_optimizer(model, cfg: TrainConfig) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


def plain_train(model, opt, corpus, cfg: TrainConfig, steps: int, device) -> None:
    """The same loop as lens_heads.training.train, written plainly."""
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        w = batch_at(corpus.train, step, 0, cfg).to(device)
        logits = model(w[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    _sync(device)


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@dataclass(frozen=True)
class TrainBench:
    """The model trained and how the runs are timed."""

    layers: int = option(4, "layers")
    d_model: int = option(128, "width")
    heads: int = option(4, "attention heads")
    seq: int = option(64, "tokens per window")
    batch: int = option(8, "windows per step")
    steps: int = option(4, "steps per timed round")
    rounds: int = rounds_option(5)
    rank_every: int = option(50, "rank tracking interval the overhead refers to")
    rank_inputs: int = option(32, "validation windows the rank is measured on")
    rank_len: int = option(64, "tokens per rank window")
    device: str = option("cpu", "torch device")
    write: bool = write_docs_option("Training and rank tracking")



REF = "plain PyTorch, SDPA attention"
HOOKED = "hooked (lens_heads.training.train)"


def loop_rounds(a: TrainBench, corpus, cfg: TrainConfig, mcfg) -> dict:
    """Each loop's timings over interleaved rounds (after one warm-up round), a fresh model each round."""

    def hooked():
        model = gpt2_model(mcfg, seed=0, device=a.device)
        return lambda: (train(model, corpus, cfg, progress=False), _sync(a.device))

    def plain(sdpa):
        torch.manual_seed(0)
        model = PlainGPT2(a.layers, a.d_model, a.heads, a.seq, 50257, sdpa=sdpa).to(a.device)
        opt = plain_optimizer(model, cfg)
        return lambda: plain_train(model, opt, corpus, cfg, a.steps, a.device)

    runs = {HOOKED: hooked, REF: lambda: plain(True), "plain PyTorch, explicit attention": lambda: plain(False)}
    alternate(runs, 1, prepared=True, keep=())  # warm-up
    # interleaved so that load from other processes hits all alike
    return alternate(runs, a.rounds, prepared=True, keep=())


def rank_overhead(a: TrainBench, corpus, cfg: TrainConfig, mcfg, step_s: float) -> tuple[float, float, int, float]:
    """One RankTracker call's seconds, its share of training time every ``rank_every`` steps, and the overhead
    measured directly: a run with two tracker calls against one without."""
    model = gpt2_model(mcfg, seed=0, device=a.device)
    tracker = RankTracker(eval_windows(corpus.val, a.rank_inputs, a.rank_len - 1), every=1)
    rank_s = repeated(lambda: (tracker(model, 0), _sync(a.device)), a.rounds).best
    direct_steps = 2 * a.steps * 2
    dcfg = TrainConfig(**{**cfg.__dict__, "steps": direct_steps})
    direct = {}
    for label, cbs in (("without", []), ("with", [RankTracker(tracker.tokens, every=direct_steps)])):
        m = gpt2_model(mcfg, seed=0, device=a.device)
        direct[label] = timed(lambda: (train(m, corpus, dcfg, callbacks=cbs, progress=False), _sync(a.device))).wall
    return rank_s, rank_s / (a.rank_every * step_s), direct_steps, direct["with"] / direct["without"] - 1


def main(argv=None) -> None:
    a = parse_settings(TrainBench, argv, __doc__)
    started_load = load_average()
    corpus = load_corpus("sotu")
    cfg = TrainConfig(steps=a.steps, batch_size=a.batch, seq_len=a.seq, warmup_steps=2, eval_every=0, log_every=10 ** 9)
    tok_per_round = a.steps * a.batch * a.seq
    mcfg = gpt2_config(a.layers, d_model=a.d_model, n_heads=a.heads, n_ctx=a.seq, d_vocab=GPT2_VOCAB)
    n_hooked = sum(p.numel() for p in gpt2_model(mcfg, seed=0).parameters())
    n_plain = sum(p.numel() for p in PlainGPT2(a.layers, a.d_model, a.heads, a.seq, 50257).parameters())
    assert n_hooked == n_plain, (n_hooked, n_plain)

    times = loop_rounds(a, corpus, cfg, mcfg)
    # on a machine shared with other jobs, the fastest round is the least disturbed estimate of each loop's cost;
    # ratios are also taken round by round (the rounds of one loop and its baseline run back to back)
    tps = {k: tok_per_round / v.best for k, v in times.items()}
    round_ratio = {k: statistics.median(r / t for r, t in zip(times[REF].walls, v.walls)) for k, v in times.items()}
    step_s = times[HOOKED].best / a.steps
    rank_s, overhead, direct_steps, direct_overhead = rank_overhead(a, corpus, cfg, mcfg, step_s)
    lines = [
        f"Setup: GPT-2 architecture {a.layers} layers, d_model {a.d_model}, {a.heads} heads, vocab 50257 "
        f"({n_hooked / 1e6:.1f}M parameters), batch {a.batch} x {a.seq} tokens, AdamW + cosine + grad clip, "
        f"device {a.device}, torch threads {torch.get_num_threads()}, {platform.processor() or platform.machine()}; "
        f"{a.rounds} interleaved rounds of {a.steps} steps per loop; data: SOTU corpus.",
        "",
        "| training loop | tokens/s (best round) | ratio to plain (SDPA), best rounds | median of per-round ratios |",
        "|---|---:|---:|---:|",
        *[f"| {k} | {v:,.0f} | {v / tps[REF]:.2f}x | {round_ratio[k]:.2f}x |" for k, v in tps.items()],
        "",
        f"Hooked GPT-2 vs plain PyTorch: **{tps[HOOKED] / tps[REF]:.2f}x** (best rounds), "
        f"{round_ratio[HOOKED]:.2f}x (median per-round ratio); target >= 0.8x.",
        "",
        f"Rank tracking (`RankTracker`, {a.rank_inputs} validation windows of {a.rank_len} tokens, per-input ranks): "
        f"{rank_s:.2f} s a call = {rank_s / step_s:.2f} training steps; every {a.rank_every} steps that is "
        f"**{overhead:.1%}** of training time (target <= 10%). Measured directly, {direct_steps} steps with tracking at "
        f"steps 0 and {direct_steps} (2 calls) vs without: {direct_overhead:+.1%} "
        f"(i.e. one call per {direct_steps // 2} steps).",
    ]
    text = "\n".join(lines)
    print(text)
    if a.write:
        write_section("Training and rank tracking",
                      f"Made by `OMP_NUM_THREADS={torch.get_num_threads()} python benchmarks/bench_train.py --write` "
                      f"({machine_line(started_load)}).\n\n" + text)


if __name__ == "__main__":
    main()
