"""The KV cache inactive heads hold, against what removing them costs, on a generation task with chat-length
prompts: GSM8K's 8-shot chain-of-thought rows (~900 tokens each) on the embedded model.

    nice python analyses/kv_savings.py --threads 1                   # n=12, the twelve scores, 3 shares, 3 draws
    python analyses/kv_savings.py --n 2 --scores "AHON (LN)" --fractions 0.3 --draws 1 --no-png   # a smoke run

Per score and share ``f``: the static head set of the ``round(f x layers x heads)`` most inactive heads by the
score's mean over the evaluated rows (what ``lens_heads.prune`` can bake into weights), and beside them random head
sets of the same size (``--draws`` seeds). For each set:

- **KV share**: the share of the KV cache held by the key/value groups the set removes whole
  (``lens_heads.ablation.kv_cache``: a grouped-query KV head is freed only when every query head it serves is
  removed; SmolLM2 has 3 query heads per KV head). This is accounted, not freed: the exported model still computes
  and caches every KV head of every layer it keeps (Hugging Face configs give all layers the same KV heads), so
  what the export frees physically is only whole dropped blocks: none for a head set (``physical_kv_share`` 0;
  ``whole_layers`` counts the layers a set holds whole, whose attention prune would zero, cache kept).
- **Cost**: the paired change of the gold answer's bits per byte (teacher-forced log-likelihood of the gold
  chain-of-thought answer, ``evaluate``) against the intact model, mean over items with a 95% percentile bootstrap
  interval over items (``lens_heads.stats.inference``; random sets: each item's change averaged over the draws).

Writes to ``--figures``: ``kv_savings_gsm8k.csv`` (one row per curve and share), ``kv_savings_gsm8k.json``
(settings, model, task, load average, the table; its provenance: date, commit, versions, machine) and
``kv_savings_gsm8k.png/.html`` (cost against KV share, with intervals).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from lens_heads import load_model, load_task, score_heads
from lens_heads.ablation.hooks import static_zeroing
from lens_heads.ablation.kv_cache import freed_groups
from lens_heads.evaluation.evaluate import evaluate, evaluate_each
from lens_heads.heads.scores import SCORE_NAMES, most_inactive, score_names
from lens_heads.models.embedded import DEFAULT_MODEL
from lens_heads.models.loading import model_meta
from lens_heads.plumbing.io import atomic_write_text
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option
from lens_heads.stats import inference
from lens_heads.viz.escape import esc
from lens_heads.viz.export import save_figure
from lens_heads.viz.palette import PALETTE

ROOT = Path(__file__).resolve().parents[1]
RANDOM = "random"


@dataclass(frozen=True)
class KVSettings:
    """What one run measures and writes (each field is a ``--flag``)."""

    model: str = option(DEFAULT_MODEL, "model name (the embedded SmolLM2-135M by default)")
    n: int = option(12, "GSM8K test items, sampled by --seed")
    seed: int = option(0, "sampling, random head sets and bootstrap seed")
    scores: tuple[str, ...] = option(tuple(SCORE_NAMES), "comma-separated scores that choose heads",
                                     parse=score_names)
    fractions: tuple[float, ...] = option((0.1, 0.3, 0.5), "shares of heads removed")
    draws: int = option(3, "random head sets per share")
    batch_size: int = option(12, "forward rows per batch (8-shot rows of ~900 tokens sharing their exemplars)")
    n_resamples: int = option(inference.N_RESAMPLES, "bootstrap resamples")
    threads: int | None = option(None, "torch CPU threads (default: torch's choice)", parse=int)
    figures: str = option(str(ROOT / "figures"), "where the table and figure go")
    no_png: bool = option(False, "write the HTML figure only (PNG needs Chromium)")


def head_sets(model, scores, s: KVSettings) -> list[dict]:
    """Every head set measured: per score and share its most inactive heads, and the random draws."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    sets = []
    for f in s.fractions:
        m = int(round(f * L * H))
        for name in s.scores:
            heads = most_inactive(scores.mean(name), scores.direction[name], m)
            sets.append(dict(curve=name, fraction=f, draw=0, heads=[tuple(map(int, h)) for h in heads]))
        for d in range(s.draws):
            order = torch.randperm(L * H, generator=torch.Generator().manual_seed(1000 * s.seed + d))
            sets.append(dict(curve=RANDOM, fraction=f, draw=d, heads=[(int(i) // H, int(i) % H) for i in order[:m]]))
    return sets


def table(model, base, results, sets: list[dict], s: KVSettings) -> pd.DataFrame:
    """One row per curve and share: KV share freed (accounted; random: mean and range over the draws), whole layers
    in the set, and the cost with its interval."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    n_kv = model.cfg.n_key_value_heads or H
    base_bpb = np.array([it.gold_bits_per_byte for it in base.items])
    rows = []
    for (curve, f), group in pd.DataFrame(sets).assign(result=results).groupby(["curve", "fraction"], sort=False):
        kv, layers = [], []
        for heads in group["heads"]:
            mask = torch.zeros(L, H, dtype=torch.bool)
            mask[tuple(zip(*heads))] = True
            freed = freed_groups(mask, n_kv)
            kv.append(float(freed.float().mean()))
            layers.append(int(mask.all(1).sum()))
        change = np.mean([[it.gold_bits_per_byte for it in r.items] for r in group["result"]], axis=0) - base_bpb
        boot = inference.mean_intervals(change[None], n_resamples=s.n_resamples, seed=s.seed)
        rows.append(dict(curve=curve, fraction=f, heads=len(group["heads"].iloc[0]), draws=len(group),
                         kv_share=float(np.mean(kv)), kv_share_min=min(kv), kv_share_max=max(kv),
                         whole_layers=float(np.mean(layers)), physical_kv_share=0.0,
                         bpb_change=float(boot.estimates[0]), bpb_change_low=float(boot.low[0]),
                         bpb_change_high=float(boot.high[0]), n=len(base_bpb)))
    return pd.DataFrame(rows)


def figure(t: pd.DataFrame, title: str) -> go.Figure:
    fig = go.Figure()
    for i, (curve, rows) in enumerate(t.groupby("curve", sort=False)):
        color = "black" if curve == RANDOM else PALETTE[i % len(PALETTE)]
        fig.add_trace(go.Scatter(
            x=100 * rows["kv_share"], y=rows["bpb_change"], name=esc(curve), mode="lines+markers",
            line=dict(color=color, dash="dot" if curve == RANDOM else "solid"),
            error_y=dict(type="data", symmetric=False, array=rows["bpb_change_high"] - rows["bpb_change"],
                         arrayminus=rows["bpb_change"] - rows["bpb_change_low"], thickness=1),
            error_x=dict(type="data", symmetric=False, array=100 * (rows["kv_share_max"] - rows["kv_share"]),
                         arrayminus=100 * (rows["kv_share"] - rows["kv_share_min"]), thickness=1),
            text=[f"{100 * f:.0f}% of heads" for f in rows["fraction"]], hovertemplate="%{text}<extra></extra>"))
    fig.update_layout(title=dict(text=esc(title), font=dict(size=12)), template="plotly_white", width=900, height=560,
                      xaxis_title="KV cache held by whole removed KV groups (%, accounted)",
                      yaxis_title="change of the gold answer's bits per byte (95% interval)")
    return fig


def parse_args(argv=None) -> KVSettings:
    return from_args(KVSettings, argv, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)


def run(model, s: KVSettings) -> pd.DataFrame:
    """Every head set measured on ``model``, the outputs written; the table."""
    started, load_start = time.perf_counter(), os.getloadavg()[0]
    task = load_task("gsm8k", n=s.n, seed=s.seed)
    base = evaluate(model, task, batch_size=s.batch_size)
    scores = score_heads(model, task, batch_size=s.batch_size)
    sets = head_sets(model, scores, s)
    results = evaluate_each(model, task, [static_zeroing(model, hs["heads"]) for hs in sets], batch_size=s.batch_size)
    t = table(model, base, results, sets, s)
    meta = model_meta(model)
    figures = Path(s.figures)
    figures.mkdir(parents=True, exist_ok=True)
    atomic_write_text(figures / "kv_savings_gsm8k.csv", t.to_csv(index=False, float_format="%.6g"))
    load_end = os.getloadavg()[0]
    write_record(figures / "kv_savings_gsm8k.json", dict(
        what="GSM8K 8-shot CoT rows: the KV cache held by the KV groups a static head set removes whole (accounted; "
             "the export frees none of it, only dropped blocks), against the change of the gold answer's bits per "
             "byte; random head sets of the same size beside",
        wall_s=time.perf_counter() - started,
        load_average=dict(start=load_start, end=load_end), threads=torch.get_num_threads(), settings=asdict(s),
        model=meta, task=task.meta(), intact_bits_per_byte=base.bits_per_byte, interval=inference.BOOTSTRAP,
        head_sets=sets, table=t.to_dict(orient="records")))
    title = (f"{meta['name']}, GSM8K {task.split} {task.shots}-shot CoT, n={len(task)}, {meta['n_heads']} query heads "
             f"per layer on {meta['n_kv_heads']} KV heads: static head sets by score vs random")
    save_figure(figure(t, title), figures / "kv_savings_gsm8k", png=not s.no_png)
    print(t.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"done in {time.perf_counter() - started:.0f} s; load average {load_start:.1f} -> {load_end:.1f}")
    return t


def main(argv=None) -> None:
    s = parse_args(argv)
    if s.threads:
        torch.set_num_threads(s.threads)
    run(load_model(s.model), s)


if __name__ == "__main__":
    main()
