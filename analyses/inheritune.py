"""Attention rank collapse and Inheritune, reproduced at CPU scale (or at paper scale on a GPU).

    OMP_NUM_THREADS=2 python analyses/inheritune.py                      # CPU scale, ~35 min on 2 idle cores
    python analyses/inheritune.py --preset gpt2-medium --device cuda     # paper scale: 24 -> 12..16 layers, OpenWebText

Writes to ``--figures`` (default ``figures/``): ``inheritune_results.csv`` (one row per stage),
``inheritune_results.json`` (everything, with settings), and PNG + HTML figures: validation loss curves,
attention rank per layer at every stage, rank during training, and the rank profile of the embedded SmolLM2.
Training runs live in ``--runs`` (default ``runs/inheritune``) and resume when interrupted.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from lens_heads.corpus import gpt2_tokenizer, load_corpus
from lens_heads.inheritune import InherituneConfig, load_result, run_inheritune
from lens_heads.io import atomic_write_json, atomic_write_text
from lens_heads.rank import approx_rank, attention_rank, mass_columns
from lens_heads.train import TrainConfig, eval_windows

PRESETS = {
    # ~35 minutes on 2 idle CPU cores (measured): the GPT-2 vocabulary (50257) dominates the cost at this width
    "cpu": dict(ref_layers=8, student_layers=4, grow_by=2, max_layers=6, d_model=64, heads=4, seq=128, batch=8,
                grad_accum=1, steps=600, warmup=60, lr=2e-3, min_lr=2e-4, eval_every=50, eval_batches=8,
                rank_every=50, rank_inputs=100, rank_len=100, corpus="sotu", amp=False, eval_tasks="arc_easy,piqa",
                eval_n=200, smollm_inputs=32),
    # the paper's GPT-2 medium run: 24 layers, student 12 growing by 2 (to 16 in the paper), ~49K tokens a step
    "gpt2-medium": dict(ref_layers=24, student_layers=12, grow_by=2, max_layers=22, d_model=1024, heads=16, seq=1024,
                        batch=12, grad_accum=4, steps=100_000, warmup=2000, lr=2e-4, min_lr=1e-5, eval_every=1000,
                        eval_batches=50, rank_every=5000, rank_inputs=100, rank_len=100, corpus="openwebtext", amp=True,
                        eval_tasks="arc_easy,piqa,hellaswag", eval_n=1000, smollm_inputs=100),
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu", help="base settings; flags below override")
    for name, typ in [("ref-layers", int), ("student-layers", int), ("grow-by", int), ("max-layers", int),
                      ("d-model", int), ("heads", int), ("seq", int), ("batch", int), ("grad-accum", int),
                      ("steps", int), ("warmup", int), ("lr", float), ("min-lr", float), ("eval-every", int),
                      ("eval-batches", int), ("rank-every", int), ("corpus", str)]:
        ap.add_argument(f"--{name}", type=typ, default=None)
    ap.add_argument("--grow-from", choices=["reference", "student"], default="reference",
                    help="growth: fresh re-inheritance from the reference (default) or keep the trained student")
    ap.add_argument("--rank-inputs", type=int, default=None, help="validation windows for attention rank (N)")
    ap.add_argument("--rank-len", type=int, default=None, help="tokens per window (T, at most --seq)")
    ap.add_argument("--smollm-inputs", type=int, default=None, help="SmolLM2 rank profile: N texts (0 to skip)")
    ap.add_argument("--smollm-len", type=int, default=100, help="SmolLM2 rank profile: T tokens each")
    ap.add_argument("--eval-tasks", default=None, help="zero-shot tasks for the trained models ('' to skip)")
    ap.add_argument("--eval-n", type=int, default=None, help="items per zero-shot task")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None, help="bf16 autocast (CUDA)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", default="runs/inheritune")
    ap.add_argument("--figures", default="figures")
    ap.add_argument("--label", default="", help="note written into the figures, e.g. 'reduced settings'")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    for key, value in PRESETS[a.preset].items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    if a.rank_len > a.seq:
        ap.error(f"--rank-len {a.rank_len} is longer than the models' context --seq {a.seq}")
    return a


def build_config(a) -> InherituneConfig:
    train = TrainConfig(steps=a.steps, batch_size=a.batch, seq_len=a.seq, grad_accum=a.grad_accum, lr=a.lr,
                        min_lr=a.min_lr, warmup_steps=a.warmup, eval_every=a.eval_every, eval_batches=a.eval_batches,
                        checkpoint_every=a.eval_every, seed=a.seed, amp=a.amp)
    return InherituneConfig(ref_layers=a.ref_layers, student_layers=a.student_layers, grow_by=a.grow_by,
                            max_layers=a.max_layers, d_model=a.d_model, n_heads=a.heads, n_ctx=a.seq, train=train,
                            grow_from=a.grow_from, rank_inputs=a.rank_inputs, rank_len=a.rank_len,
                            rank_every=a.rank_every, seed=a.seed, device=a.device)


# ---------------------------------------------------------------- extra measurements


def uniform_causal_levels(length: int) -> dict:
    """Rank and m* of uniform causal averaging (each query spreads evenly over its prefix) at ``length`` tokens:
    the attention of a freshly initialised GPT-2, and of one whose attention has learned nothing yet."""
    U = torch.ones(length, length).tril()
    U = U / U.sum(-1, keepdim=True)
    return {"length": length, "rank": int(approx_rank(U)), "mass_columns": int(mass_columns(U))}


def cached(path: Path, settings: dict, compute):
    """``compute()`` once per ``settings``: results of slow extra measurements are kept beside the runs."""
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("settings") == settings:
            return saved["value"]
    value = compute()
    atomic_write_json(path, {"settings": settings, "value": value})
    return value


def smollm_profile(corpus, tokenizer, n: int, length: int) -> dict:
    """Rank profile of the embedded SmolLM2-135M on English validation text (per-input and batch-averaged)."""
    from lens_heads import load_model

    model = load_model()
    # text from the held-out SOTU years, re-tokenised by SmolLM2's own tokenizer and cut to `length` tokens
    windows = eval_windows(corpus.val, n, int(length * 1.5))
    texts = [tokenizer.decode(w.tolist()).replace("<|endoftext|>", "\n") for w in windows]
    out = {}
    for average in (False, True):
        profile = attention_rank(model, texts, average=average, max_len=length, batch_size=8, progress=True)
        out["averaged" if average else "per_input"] = profile.to_dict()
    return out


def zero_shot(a, stages_dir: Path, result, tokenizer) -> list[dict]:
    """Zero-shot accuracy of the reference, the final student and the scratch baselines (lens_heads.evaluate)."""
    tasks = [t for t in a.eval_tasks.split(",") if t]
    if not tasks:
        return []
    from lens_heads.evaluate import evaluate, within_context
    from lens_heads.tasks import load_task
    from lens_heads.inheritune import gpt2_config, gpt2_model
    from lens_heads.train import load_model_state

    rows = []
    for task_name in tasks:
        task = load_task(task_name, n=a.eval_n, seed=a.seed)
        for stage in result.stages:
            if stage.name.startswith("student") and stage.n_layers != result.final_layers:
                continue
            cfg = gpt2_config(stage.n_layers, d_model=a.d_model, n_heads=a.heads, n_ctx=a.seq)
            model = gpt2_model(cfg, seed=0, tokenizer=tokenizer, device=a.device)
            load_model_state(model, stages_dir / stage.name / "final" / "model.safetensors")
            fitting, dropped = within_context(model, task)  # a toy context can be shorter than a few prompts
            res = evaluate(model, fitting, batch_size=16, progress=False)
            rows.append({"stage": stage.name, **res.summary(), "dropped_longer_than_context": dropped})
            print(f"zero-shot {task_name} {stage.name}: {res.accuracy:.3f} on n={res.n} ({dropped} items longer "
                  f"than the context dropped; chance {res.chance:.2f})")
    return rows


# ---------------------------------------------------------------- figures


def write_figure(fig, stem: Path) -> list[str]:
    """PNG (kaleido, needs a Chrome such as /usr/bin/chromium) and self-contained HTML."""
    written = []
    fig.write_html(str(stem.with_suffix(".html")), include_plotlyjs=True)
    written.append(stem.with_suffix(".html").name)
    try:
        fig.write_image(str(stem.with_suffix(".png")), width=1100, height=600, scale=1.5)
        written.append(stem.with_suffix(".png").name)
    except Exception as err:  # noqa: BLE001 - a missing Chrome must not lose the run's numbers
        print(f"PNG for {stem.name} not written ({type(err).__name__}: {err}); install chromium", file=sys.stderr)
    return written


def figures(result, smollm: dict | None, out: Path, subtitle: str, uniform: dict) -> list[str]:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    colors = {"reference": "#222222", "student": "#d62728", "scratch": "#1f77b4"}
    dashes = {"scratch_1x": "dot", "scratch_2x": "dash"}
    written = []

    def dash(stage) -> str:  # the two scratch baselines (1x and 2x steps) apart, in every figure
        return next((d for k, d in dashes.items() if stage.name.endswith(k.split("_")[1])), "dot") \
            if stage.kind == "scratch" else "solid"

    fig = go.Figure()
    for s in result.stages:
        h = [r for r in s.history if "val_loss" in r]
        fig.add_scatter(x=[r["tokens_seen"] for r in h], y=[r["val_loss"] for r in h], mode="lines+markers",
                        name=f"{s.name} ({s.n_layers}L)", line=dict(color=colors[s.kind], dash=dash(s),
                                                                     width=3 if s.kind == "reference" else 2),
                        opacity=1.0 if s.n_layers == result.final_layers or s.kind == "reference" else 0.5)
    fig.add_hline(y=result.reference_val_loss, line=dict(color="#222222", dash="dot", width=1),
                  annotation_text=f"reference final {result.reference_val_loss:.3f}")
    fig.update_layout(title=f"Validation loss: reference, Inheritune students, same-size scratch<br><sup>{subtitle}</sup>",
                      xaxis_title="tokens seen by the model (students: own training only)", yaxis_title="validation loss",
                      template="plotly_white")
    written += write_figure(fig, out / "inheritune_val_loss")

    fig = make_subplots(rows=1, cols=2, subplot_titles=("max rank over heads (after training)",
                                                        "mean rank over heads (after training)"))
    for s in result.stages:
        for col, key in ((1, "max_rank"), (2, "mean_rank")):
            fig.add_scatter(x=list(range(s.n_layers)), y=s.rank[key], mode="lines+markers", name=s.name,
                            legendgroup=s.name, showlegend=col == 1, line=dict(color=colors[s.kind], dash=dash(s)),
                            row=1, col=col)
        if s.kind in ("student", "reference"):
            fig.add_scatter(x=list(range(s.n_layers)), y=s.rank_at_init["max_rank"], mode="markers",
                            marker=dict(symbol="x", size=9, color=colors[s.kind]),
                            name=f"{s.name} {'at inheritance' if s.kind == 'student' else 'at init'}", row=1, col=1)
    for col in (1, 2):
        fig.add_hline(y=uniform["rank"], line=dict(color="grey", dash="dot", width=1), row=1, col=col,
                      annotation_text=f"uniform causal averaging: rank {uniform['rank']}")
    meta = result.meta["rank"]
    fig.update_layout(title=f"Attention rank per layer at every stage<br><sup>90% spectral energy, N={meta['n_inputs']} "
                            f"validation windows of T={meta['length']} tokens, {meta['mode']}<br>{subtitle}</sup>",
                      margin=dict(t=150),
                      template="plotly_white")
    fig.update_xaxes(title_text="layer")
    fig.update_yaxes(title_text="approximate rank", row=1, col=1)
    written += write_figure(fig, out / "inheritune_rank_per_layer")

    ref = result.stages[0]
    tracked = [r for r in ref.history if "max_rank" in r]
    if tracked:
        z = np.array([r["max_rank"] for r in tracked]).T
        fig = go.Figure(go.Heatmap(z=z, x=[r["step"] for r in tracked], y=list(range(z.shape[0])),
                                   colorbar=dict(title="max rank"), colorscale="Viridis"))
        fig.update_layout(title=f"Reference: max attention rank per layer during training<br><sup>{subtitle}</sup>",
                          xaxis_title="step", yaxis_title="layer", template="plotly_white")
        written += write_figure(fig, out / "inheritune_rank_during_training")

    if smollm:
        fig = make_subplots(rows=1, cols=2, subplot_titles=("approximate rank per layer",
                                                            "key columns holding 90% of the mass (m*)"))
        for mode, line_dash in (("per_input", "solid"), ("averaged", "dash")):
            p = smollm[mode]
            layers = list(range(len(p["max_rank"])))
            fig.add_scatter(x=layers, y=p["max_rank"], name=f"max over heads ({mode})", line=dict(dash=line_dash, color="#d62728"),
                            row=1, col=1)
            fig.add_scatter(x=layers, y=p["mean_rank"], name=f"mean over heads ({mode})", line=dict(dash=line_dash, color="#1f77b4"),
                            row=1, col=1)
            fig.add_scatter(x=layers, y=p["mass_columns"], name=f"m* ({mode})", line=dict(dash=line_dash, color="#2ca02c"),
                            row=1, col=2)
        lazy = [i for i, flag in enumerate(smollm["per_input"]["lazy"]) if flag]
        fig.add_scatter(x=lazy, y=[smollm["per_input"]["max_rank"][i] for i in lazy], mode="markers", name="lazy layer",
                        marker=dict(symbol="circle-open", size=14, color="black"), row=1, col=1)
        m = smollm["per_input"]["meta"]
        fig.update_layout(title=f"SmolLM2-135M-Instruct (embedded): attention rank profile, N={m['n_inputs']} texts of "
                                f"T={m['max_length']} tokens (held-out SOTU text)<br><sup>{smollm['per_input']['lazy_rule']}"
                                f"</sup>", template="plotly_white")
        fig.update_xaxes(title_text="layer")
        written += write_figure(fig, out / "smollm2_rank_profile")
    return written


def main(argv=None):
    a = parse_args(argv)
    torch.manual_seed(a.seed)
    out = Path(a.figures)
    out.mkdir(parents=True, exist_ok=True)
    runs = Path(a.runs)
    started = time.time()
    corpus = load_corpus(a.corpus)
    tokenizer = gpt2_tokenizer()
    config = build_config(a)
    print(f"corpus: {corpus}\nconfig: {json.dumps(asdict(config))}")
    result = run_inheritune(config, corpus, out_dir=runs, tokenizer=tokenizer, progress=not a.no_progress)
    result = load_result(runs)  # the same numbers whether trained now or reloaded
    table = result.to_dataframe()
    print(table.to_string())

    smollm = cached(runs / "extras" / "smollm2_rank.json", {"n": a.smollm_inputs, "len": a.smollm_len},
                    lambda: smollm_profile(corpus, tokenizer, a.smollm_inputs, a.smollm_len)) if a.smollm_inputs else None
    evals = cached(runs / "extras" / "zero_shot.json", {"tasks": a.eval_tasks, "n": a.eval_n, "seed": a.seed},
                   lambda: zero_shot(a, runs, result, tokenizer))
    if evals:
        acc = pd.DataFrame(evals).pivot(index="stage", columns="task", values="accuracy").add_prefix("zero_shot_")
        table = table.merge(acc, left_on="stage", right_index=True, how="left")

    subtitle = (f"{a.preset} preset: GPT-2 d_model {a.d_model}, {a.heads} heads, {a.steps} steps of {a.batch * a.grad_accum}x"
                f"{a.seq} tokens, corpus {corpus.meta.get('name')}, seed {a.seed}" + (f"; {a.label}" if a.label else ""))
    uniform = uniform_causal_levels(a.rank_len)
    written = figures(result, smollm, out, subtitle, uniform)
    atomic_write_text(out / "inheritune_results.csv", table.to_csv(index=False))
    atomic_write_json(out / "inheritune_results.json", {
        "what": "Inheritune at small scale: reference, students (growth stages), same-size scratch baselines",
        "settings": vars(a), "corpus": corpus.meta, "table": table.to_dict(orient="records"),
        "reference_val_loss": result.reference_val_loss, "final_student_layers": result.final_layers,
        "stages": [{k: v for k, v in asdict(s).items() if k != "history"} for s in result.stages],
        "histories": {s.name: s.history for s in result.stages}, "smollm2_rank": smollm, "zero_shot": evals,
        "rank_method": result.meta["rank"], "lazy_rule": result.stages[0].rank["lazy_rule"],
        "uniform_causal_attention": uniform,
        "figures": written, "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "wall_time_s": time.time() - started,
    })
    print(f"wrote {', '.join(written)} and inheritune_results.csv/json to {out} in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
