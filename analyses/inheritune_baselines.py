"""The Inheritune paper's claims against its baselines, measured at CPU scale over several training seeds.

    OMP_NUM_THREADS=1 nice python analyses/inheritune_baselines.py            # 3 seeds, the defaults below

For each seed, `run_inheritune` trains (each stage resumable, in ``--runs/seed_<s>``): the reference, the Inheritune
student, same-size scratch for 1x and 2x the steps, stacking and hybrid stacking (from one half-depth source), the
half-width warm start, logit distillation and DistilBERT, all at the student's size with the same loop and steps.
Then, each cached under ``--runs/extras`` so that a rerun (or a larger one, with other flags) computes only what is
missing:

- validation loss against steps for every method (the runs' histories) and the final loss per validation window;
- the final-loss comparison of every method with Inheritune, paired over training seeds (the seed is the unit that
  is resampled: n = the number of seeds) and, as a second view, paired over validation windows, each window's loss
  averaged over the seeds (the variation between windows, with the trainings averaged out);
- "converges faster": for each method against Inheritune, the loss both reach (the worse of the two final losses),
  the steps each needs to reach it (linear between the recorded validation points) and their ratio, with its
  interval over seeds;
- zero-shot accuracy on the paper's tasks with chance, and paired tests against Inheritune over items (each item's
  correctness averaged over the seeds: the same items are evaluated for every seed);
- the attention-rank profile (max rank over heads per layer) of every model: "no lazy layers".

Comparisons are called by the project's rule (`lens_heads.stats.calling`). Writes ``inheritune_baselines.json``
(everything, with settings), ``inheritune_baselines.csv`` (one row per method), ``inheritune_baselines_tests.csv``
(every paired test) and the figures ``inheritune_baselines_val_loss`` and ``inheritune_baselines_rank`` (PNG + HTML).
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from lens_heads.collapse.checkpoints import load_model_state
from lens_heads.collapse.corpus import gpt2_tokenizer, load_corpus
from lens_heads.collapse.distill import DistillConfig
from lens_heads.collapse.gpt2 import PADDED_VOCAB, GPT2Options, gpt2_config, gpt2_model
from lens_heads.collapse.inheritune_config import InherituneConfig
from lens_heads.collapse.inheritune_result import InherituneResult, Stage
from lens_heads.collapse.inheritune_run import run_inheritune
from lens_heads.collapse.train_config import TrainConfig
from lens_heads.collapse.windows import eval_windows
from lens_heads.collapse.zero_shot import PAPER_TASKS
from lens_heads.data.rows import within_context
from lens_heads.data.tasks import load_task
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.plumbing.cache import keyed
from lens_heads.plumbing.io import atomic_write_json, atomic_write_text
from lens_heads.plumbing.settings import from_args, option
from lens_heads.stats.calling import RULE, call_table, paired_tests
from lens_heads.viz.plots import save_figure

BASELINES = ("stacking", "hybrid_stacking", "half_width", "distill_logit", "distill_distilbert")
INHERITUNE = "Inheritune"


@dataclass(frozen=True)
class BaselineSettings:
    """The CPU preset's model (d_model 64, 4 heads, context 128, the authors' GPT-2) at the depth ratio of the paper's
    XL run (an 8-layer reference, 4-layer students that do not grow), with a shorter schedule (80 steps of 4 x 128
    tokens) so that three seeds of every baseline fit in about half an hour of one CPU core."""

    seeds: str = option("0,1,2", "training seeds (comma list): every model of the run is trained once per seed")
    ref_layers: int = option(8, "reference depth")
    student_layers: int = option(4, "student depth (also the baselines')")
    d_model: int = option(64, "width")
    heads: int = option(4, "attention heads")
    seq: int = option(128, "tokens per window")
    batch: int = option(4, "windows per step")
    steps: int = option(80, "optimizer steps per stage (2x for the second scratch baseline)")
    warmup: int = option(8, "linear warm-up steps")
    lr: float = option(2e-3, "peak learning rate")
    min_lr: float = option(2e-4, "cosine floor")
    eval_every: int = option(10, "steps between validation losses (the convergence curves' resolution)")
    eval_batches: int = option(4, "validation batches per curve point")
    baselines: str = option(",".join(BASELINES), "comma list of the baselines beside same-size scratch")
    distill_temperature: float = option(2.0, "distillation temperature T (> 0)")
    distill_alpha: float = option(0.5, "logit distillation: weight of the T^2 KL term, the LM loss gets the rest")
    rank_inputs: int = option(32, "validation windows for attention rank (N)")
    rank_len: int = option(100, "tokens per rank window (T)")
    loss_windows: int = option(64, "validation windows whose final losses are compared item by item")
    eval_tasks: str = option(",".join(PAPER_TASKS), "zero-shot tasks ('' to skip)")
    eval_n: int = option(30, "items per zero-shot task (the same items for every seed)")
    n_resamples: int = option(2000, "bootstrap and permutation resamples")
    runs: str = option("runs/inheritune_baselines", "training runs and cached measurements (resumable)")
    figures: str = option("figures", "where tables and figures go")
    no_png: bool = option(False, "HTML figures only")
    no_progress: bool = option(False, "no progress bars")

    def __post_init__(self):
        DistillConfig.logit(temperature=self.distill_temperature, kd_weight=self.distill_alpha)  # refused here
        if self.rank_len > self.seq:
            raise ValueError(f"--rank-len {self.rank_len} exceeds the context --seq {self.seq}")
        if len(self.seed_list) < 2:
            raise ValueError("give at least 2 --seeds: the comparisons resample seeds")

    @property
    def seed_list(self) -> list[int]:
        return [int(s) for s in self.seeds.split(",") if s.strip()]


def parse_args(argv=None) -> BaselineSettings:
    return from_args(BaselineSettings, argv, description=__doc__)


def build_config(a: BaselineSettings, seed: int) -> InherituneConfig:
    train = TrainConfig(steps=a.steps, batch_size=a.batch, seq_len=a.seq, lr=a.lr, min_lr=a.min_lr,
                        warmup_steps=a.warmup, eval_every=a.eval_every, eval_batches=a.eval_batches,
                        checkpoint_every=max(a.eval_every, 50), seed=seed)
    return InherituneConfig(ref_layers=a.ref_layers, student_layers=a.student_layers, grow_by=1,
                            max_layers=a.student_layers, d_model=a.d_model, n_heads=a.heads, n_ctx=a.seq,
                            d_vocab=PADDED_VOCAB, train=train, ablations=tuple(x for x in a.baselines.split(",") if x),
                            distill_logit=DistillConfig.logit(a.distill_temperature, a.distill_alpha),
                            distill_distilbert=DistillConfig.distilbert(a.distill_temperature),
                            rank_inputs=a.rank_inputs, rank_len=a.rank_len, seed=seed)


def label(stage: Stage) -> str:
    """The method a trained model stands for, by its stage."""
    if stage.kind == "student":
        return INHERITUNE
    if stage.kind == "reference":
        return f"reference ({stage.n_layers}L)"
    if stage.kind == "scratch":
        return f"scratch {stage.name.rsplit('_', 1)[-1]}"
    return stage.name.rsplit("_", 1)[0].replace("_", " ")


def compared(result: InherituneResult) -> list[Stage]:
    """The trained models compared: the reference, the final student and every baseline (not the warm starts'
    sources, nor students of other sizes)."""
    return [s for s in result.stages if s.kind not in ("stack_source", "width_source")
            and not (s.kind == "student" and s.n_layers != result.final_layers)]


def load_stage(a: BaselineSettings, folder: Path, stage: Stage, tokenizer):
    cfg = gpt2_config(stage.n_layers, d_model=stage.d_model or a.d_model, n_heads=a.heads, n_ctx=a.seq,
                      d_vocab=PADDED_VOCAB)
    model = gpt2_model(cfg, seed=0, options=GPT2Options(), tokenizer=tokenizer)
    load_model_state(model, folder / stage.name / "final" / "model.safetensors")
    return model


@torch.no_grad()
def window_losses(model, windows: torch.Tensor, batch: int = 16) -> list[float]:
    """Mean next-token loss of each validation window."""
    out = []
    for chunk in windows.split(batch):
        logits = model(chunk[:, :-1]).float()
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none")
        out += loss.mean(-1).tolist()
    return out


def zero_shot_items(a: BaselineSettings, model) -> dict:
    """Per task: each evaluated item's correctness under the paper's metric, with chance and the items dropped as
    longer than the context."""
    out = {}
    for task_name in [t for t in a.eval_tasks.split(",") if t]:
        metric = PAPER_TASKS.get(task_name, "sum")
        fitting, dropped = within_context(model, load_task(task_name, n=a.eval_n, seed=0, shots=0))
        res = evaluate(model, fitting, batch_size=16, progress=False, primary=metric)
        out[task_name] = {"metric": metric, "chance": res.chance, "dropped": dropped,
                          "ids": [it.id for it in res.items], "correct": [bool(it.correct(metric)) for it in res.items]}
    return out


def measure_seed(a: BaselineSettings, seed: int, corpus, tokenizer) -> dict:
    """Train (or reload) one seed's run, then its per-window losses and zero-shot items, each cached."""
    folder = Path(a.runs) / f"seed_{seed}"
    result = run_inheritune(build_config(a, seed), corpus, out_dir=folder, tokenizer=tokenizer,
                            progress=not a.no_progress)
    windows = eval_windows(corpus.val, a.loss_windows, a.seq)
    per_stage = {}
    for stage in compared(result):
        key = {"seed": seed, "stage": stage.name, "val_loss": stage.val_loss, "windows": a.loss_windows,
               "seq": a.seq, "tasks": a.eval_tasks, "n": a.eval_n}
        per_stage[stage.name] = keyed(Path(a.runs) / "extras" / f"seed_{seed}_{stage.name}.json", key,
                                      lambda stage=stage: _measure(a, folder, stage, windows, tokenizer))
    return {"result": result, "measured": per_stage}


def _measure(a: BaselineSettings, folder: Path, stage: Stage, windows, tokenizer) -> dict:
    model = load_stage(a, folder, stage, tokenizer)
    t0 = time.process_time()
    out = {"window_losses": window_losses(model, windows), "zero_shot": zero_shot_items(a, model)}
    out["cpu_s"] = time.process_time() - t0
    return out


# ---------------------------------------------------------------- the comparisons


def steps_to_reach(history: list[dict], target: float) -> float:
    """The first step at which the validation loss reaches ``target`` (linear between the recorded points), NaN
    where it never does."""
    points = [(h["step"], h["val_loss"]) for h in history if "val_loss" in h]
    for (s0, l0), (s1, l1) in zip(points, points[1:]):
        if l1 <= target:
            return float(s0 if l0 <= target else s0 + (l0 - target) / (l0 - l1) * (s1 - s0))
    return float(points[0][0]) if points and points[0][1] <= target else float("nan")


def per_seed_table(runs: dict[int, dict]) -> pd.DataFrame:
    """One row per (seed, method): final loss, budget, rank summary, and the steps it and Inheritune need to reach
    the worse of their two final losses."""
    rows = []
    for seed, run in runs.items():
        result: InherituneResult = run["result"]
        stages = compared(result)
        inh = next(s for s in stages if s.kind == "student")
        for s in stages:
            target = max(s.val_loss, inh.val_loss)
            budget = result.budget(s)
            rows.append({"seed": seed, "method": label(s), "stage": s.name, "n_layers": s.n_layers, "steps": s.steps,
                         "tokens_seen": s.tokens_seen, "val_loss": s.val_loss, **budget,
                         "n_lazy_layers": int(np.sum(s.rank["lazy"])), "max_rank": s.rank["max_rank"],
                         "min_max_rank": float(np.min(s.rank["max_rank"])), "target_loss": target,
                         "steps_to_target": steps_to_reach(s.history, target),
                         "inheritune_steps_to_target": steps_to_reach(inh.history, target)})
    return pd.DataFrame(rows)


def loss_tests(table: pd.DataFrame, runs: dict[int, dict], n_resamples: int) -> pd.DataFrame:
    """Every method's final validation loss against Inheritune's: over seeds (the trainings as the unit) and over
    validation windows (each window's loss averaged over the seeds: the windows as the unit)."""
    methods = [m for m in table["method"].unique() if m != INHERITUNE]
    wide = table.pivot(index="seed", columns="method", values="val_loss")
    seeds = sorted(runs)
    over_seeds = named_tests(wide[methods].to_numpy().T, np.tile(wide[INHERITUNE].to_numpy(), (len(methods), 1)),
                             methods, False, n_resamples, quantity="final validation loss", unit="training seed")

    def windows(method: str) -> np.ndarray:
        return np.mean([runs[s]["measured"][_stage_of(table, s, method)]["window_losses"] for s in seeds], axis=0)

    x = np.stack([windows(m) for m in methods])
    y = np.tile(windows(INHERITUNE), (len(methods), 1))
    over_windows = named_tests(x, y, methods, False, n_resamples, quantity="final validation loss",
                               unit="validation window (mean over seeds)")
    return pd.concat([over_seeds, over_windows], ignore_index=True)


def named_tests(x: np.ndarray, y: np.ndarray, labels: list[str], higher_is_better: bool, n_resamples: int,
                **describe) -> pd.DataFrame:
    """`paired_tests` of each row of ``x`` (the method named by its label) against ``y`` (Inheritune), each row's
    sides named so that its verdict says which is better."""
    tests = paired_tests(x, y, labels, higher_is_better=higher_is_better, n_resamples=n_resamples, b=INHERITUNE,
                         **describe)
    tests["a"] = list(labels)
    return call_table(tests.drop(columns=["p_adjusted", "verdict"]))


def _stage_of(table: pd.DataFrame, seed: int, method: str) -> str:
    return table[(table["seed"] == seed) & (table["method"] == method)]["stage"].iloc[0]


def convergence_tests(table: pd.DataFrame, n_resamples: int) -> pd.DataFrame:
    """log(steps the method needs) - log(steps Inheritune needs) to reach the worse of their final losses, over
    seeds: its exponential is the speed-up ratio (> 1: Inheritune gets there in fewer steps). Where a side is at that
    loss before its first step (Inheritune's inherited weights can start below a baseline's final loss) the ratio is
    unbounded: that method's row is not tested and says so."""
    rows = table[table["method"] != INHERITUNE]
    methods, x, y, unbounded = [], [], [], []
    for m in rows["method"].unique():
        g = rows[rows["method"] == m].sort_values("seed")
        steps_m, steps_i = g["steps_to_target"].to_numpy(), g["inheritune_steps_to_target"].to_numpy()
        if (steps_m > 0).all() and (steps_i > 0).all():
            methods.append(m)
            x.append(np.log(steps_m))
            y.append(np.log(steps_i))
        else:
            at_start = [int(sd) for sd, a, b in zip(g["seed"], steps_m, steps_i) if not (a > 0 and b > 0)]
            unbounded.append({"k": m, "a": m, "b": INHERITUNE, "difference": float("nan"), "low": float("nan"),
                              "high": float("nan"), "p_value": float("nan"), "higher_is_better": False,
                              "n": len(g), "quantity": "log steps to the worse final loss", "unit": "training seed",
                              "test_note": f"at the compared loss before the first step in seed(s) {at_start}: the "
                                           "ratio of steps is unbounded"})
    parts = []
    if methods:
        parts.append(named_tests(np.stack(x), np.stack(y), methods, False, n_resamples,
                                 quantity="log steps to the worse final loss", unit="training seed")
                     .drop(columns=["p_adjusted", "verdict"]))
    if unbounded:
        parts.append(pd.DataFrame(unbounded))
    out = call_table(pd.concat(parts, ignore_index=True))
    for col in ("difference", "low", "high"):
        out[f"ratio_{col}"] = np.exp(out[col])
    return out


def zero_shot_tests(table: pd.DataFrame, runs: dict[int, dict], n_resamples: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Accuracy per (method, task) over seeds and items, with chance; paired tests against Inheritune over items (each
    item's correctness averaged over the seeds), every (method, task) one row of one table."""
    seeds = sorted(runs)
    methods = list(table["method"].unique())
    first = runs[seeds[0]]["measured"][_stage_of(table, seeds[0], INHERITUNE)]["zero_shot"]
    acc_rows, per_task = [], []
    for task, info in first.items():
        def correct(method: str) -> np.ndarray:
            return np.mean([np.asarray(runs[s]["measured"][_stage_of(table, s, method)]["zero_shot"][task]
                                       ["correct"], dtype=float) for s in seeds], axis=0)
        for m in methods:
            c = correct(m)
            acc_rows.append({"method": m, "task": task, "metric": info["metric"], "accuracy": float(c.mean()),
                             "n_items": len(c), "seeds": len(seeds), "chance": info["chance"],
                             "dropped": info["dropped"]})
        others = [m for m in methods if m != INHERITUNE]
        if others and len(correct(INHERITUNE)) >= 2:
            t = named_tests(np.stack([correct(m) for m in others]), np.tile(correct(INHERITUNE), (len(others), 1)),
                            others, True, n_resamples, quantity="zero-shot accuracy", unit="item (mean over seeds)")
            per_task.append(t.assign(task=task, method=t["k"]))
    if not per_task:
        return pd.DataFrame(acc_rows), pd.DataFrame()
    # one family: every (method, task) comparison, adjusted together
    tests = call_table(pd.concat(per_task, ignore_index=True).drop(columns=["p_adjusted", "verdict"]))
    return pd.DataFrame(acc_rows), tests


def method_table(table: pd.DataFrame, tests: pd.DataFrame, speed: pd.DataFrame) -> pd.DataFrame:
    """One row per method: mean final loss over seeds (min, max), budget, lazy layers, and its comparisons with
    Inheritune (over seeds and over windows) and the speed-up ratio."""
    rows = []
    for m, g in table.groupby("method", sort=False):
        row = {"method": m, "n_layers": int(g["n_layers"].iloc[0]), "seeds": len(g), "steps": int(g["steps"].iloc[0]),
               "val_loss_mean": g["val_loss"].mean(), "val_loss_min": g["val_loss"].min(),
               "val_loss_max": g["val_loss"].max(), "train_flops": g["train_flops"].mean(),
               "total_flops": g["total_flops"].mean(), "uses_reference": bool(g["uses_reference"].iloc[0]),
               "n_lazy_layers_max": int(g["n_lazy_layers"].max()), "min_max_rank": float(g["min_max_rank"].min())}
        for unit, tag in (("training seed", "seeds"), ("validation window (mean over seeds)", "windows")):
            t = tests[(tests["k"] == m) & (tests["unit"] == unit)]
            if len(t):
                r = t.iloc[0]
                row.update({f"minus_inheritune_{tag}": r["difference"], f"low_{tag}": r["low"],
                            f"high_{tag}": r["high"], f"p_{tag}": r["p_value"], f"p_adjusted_{tag}": r["p_adjusted"],
                            f"verdict_{tag}": r["verdict"]})
        s = speed[speed["k"] == m]
        if len(s):
            r = s.iloc[0]
            row.update({"speedup": r["ratio_difference"], "speedup_low": r["ratio_low"],
                        "speedup_high": r["ratio_high"], "speedup_p": r["p_value"],
                        "speedup_p_adjusted": r["p_adjusted"], "speedup_verdict": r["verdict"]})
        rows.append(row)
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- figures


def curves_figure(runs: dict[int, dict], out: Path, subtitle: str, png: bool) -> list[str]:
    """Validation loss against steps, mean over seeds with the seeds' range as a band, every method."""
    import plotly.graph_objects as go

    fig = go.Figure()
    palette = ["#222222", "#d62728", "#1f77b4", "#aec7e8", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
               "#ff7f0e", "#2ca02c", "#9467bd"]
    curves: dict[str, list[pd.Series]] = {}
    for run in runs.values():
        for s in compared(run["result"]):
            h = [r for r in s.history if "val_loss" in r]
            curves.setdefault(label(s), []).append(pd.Series([r["val_loss"] for r in h], index=[r["step"] for r in h]))
    for i, (m, series) in enumerate(curves.items()):
        df = pd.concat(series, axis=1)
        c = palette[i % len(palette)]
        x = list(df.index)
        fig.add_scatter(x=x + x[::-1], y=list(df.max(axis=1)) + list(df.min(axis=1))[::-1], fill="toself", mode="lines",
                        fillcolor=c, opacity=0.15, line=dict(width=0), showlegend=False, hoverinfo="skip")
        fig.add_scatter(x=x, y=df.mean(axis=1), mode="lines", name=m,
                        line=dict(color=c, width=3 if m == INHERITUNE else 1.5))
    finals = [v for series in curves.values() for sr in series for v in sr.iloc[-1:]]
    warm = [v for series in curves.values() for sr in series for v in sr.iloc[:1] if v < max(finals) + 2]
    top = max(warm + finals) + 0.2  # the warm starts' first points; the fresh inits start far above (ln of vocab)
    fig.update_layout(title=f"Validation loss against steps, mean over {len(runs)} seeds (band: min to max; y axis "
                            f"cut at {top:.1f}, the fresh initialisations start near 10.8)<br><sup>{subtitle}</sup>",
                      xaxis_title="step of the model's own training (warm starts' sources not counted)",
                      yaxis_title="validation loss", yaxis_range=[min(finals) - 0.1, top], template="plotly_white")
    return save_figure(fig, out / "inheritune_baselines_val_loss", png=png, width=1100, height=600, scale=1.5)


def rank_figure(table: pd.DataFrame, uniform_rank: int, out: Path, subtitle: str, png: bool) -> list[str]:
    import plotly.graph_objects as go

    fig = go.Figure()
    for m, g in table.groupby("method", sort=False):
        ranks = np.array(list(g["max_rank"]))
        bold = m == INHERITUNE or m.startswith(("reference", "scratch 1x"))
        fig.add_scatter(x=list(range(ranks.shape[1])), y=ranks.mean(0), mode="lines+markers", name=m,
                        line=dict(width=3 if bold else 1, dash="solid" if bold else "dot"))
    fig.add_hline(y=uniform_rank, line=dict(color="grey", dash="dot"), annotation_text="uniform causal averaging")
    fig.add_hline(y=2, line=dict(color="black", dash="dash"), annotation_text="lazy: every head <= 2")
    fig.update_layout(title=f"Max attention rank over heads per layer, mean over seeds<br><sup>{subtitle}</sup>",
                      xaxis_title="layer", yaxis_title="approximate rank (90% energy)", template="plotly_white")
    return save_figure(fig, out / "inheritune_baselines_rank", png=png, width=1100, height=600, scale=1.5)


def main(argv=None):
    a = parse_args(argv)
    started, cpu0 = time.time(), time.process_time()
    out = Path(a.figures)
    out.mkdir(parents=True, exist_ok=True)
    corpus, tokenizer = load_corpus("sotu"), gpt2_tokenizer()
    runs = {seed: measure_seed(a, seed, corpus, tokenizer) for seed in a.seed_list}
    table = per_seed_table(runs)
    tests = loss_tests(table, runs, a.n_resamples)
    speed = convergence_tests(table, a.n_resamples)
    accuracy, zs_tests = zero_shot_tests(table, runs, a.n_resamples)
    methods = method_table(table, tests, speed)
    print(methods.drop(columns=[c for c in methods if c.startswith("p_")]).to_string())
    # each table is its own family (BH within it), as its verdicts say
    all_tests = pd.concat([t.assign(table=name) for name, t in (("final loss", tests),
                                                                ("steps to the same loss", speed),
                                                                ("zero-shot", zs_tests)) if len(t)], ignore_index=True)
    from lens_heads.collapse.rank import approx_rank

    U = torch.ones(a.rank_len, a.rank_len).tril()
    uniform = int(approx_rank(U / U.sum(-1, keepdim=True)))
    subtitle = (f"GPT-2 (authors') d_model {a.d_model}, {a.heads} heads, reference {a.ref_layers}L, students "
                f"{a.student_layers}L; {a.steps} steps of {a.batch}x{a.seq} SOTU tokens; seeds {a.seeds}")
    written = curves_figure(runs, out, subtitle, not a.no_png) + rank_figure(table, uniform, out, subtitle,
                                                                            not a.no_png)
    atomic_write_text(out / "inheritune_baselines.csv", methods.to_csv(index=False))
    atomic_write_text(out / "inheritune_baselines_tests.csv", all_tests.to_csv(index=False))
    cpu_train = float(sum(s.wall_time_s for r in runs.values() for s in r["result"].stages))
    atomic_write_json(out / "inheritune_baselines.json", {
        "what": "Inheritune against the paper's baselines at CPU scale, several training seeds",
        "settings": asdict(a), "calling_rule": RULE, "corpus": corpus.meta,
        "methods": methods.to_dict(orient="records"), "per_seed": table.to_dict(orient="records"),
        "final_loss_tests": tests.to_dict(orient="records"), "convergence_tests": speed.to_dict(orient="records"),
        "zero_shot_accuracy": accuracy.to_dict(orient="records"), "zero_shot_tests": zs_tests.to_dict(orient="records"),
        "stage_methods": {label(s): s.method for s in compared(runs[a.seed_list[0]]["result"])},
        "histories": {str(seed): {label(s): [{k: h[k] for k in ("step", "val_loss") if k in h} for h in s.history
                                             if "val_loss" in h] for s in compared(r["result"])}
                      for seed, r in runs.items()},
        "rank": {"definition": runs[a.seed_list[0]]["result"].meta["rank"], "uniform_causal_rank": uniform},
        "growth": runs[a.seed_list[0]]["result"].meta["growth"],
        "figures": written, "training_time_s": cpu_train,
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        "wall_time_s": time.time() - started, "cpu_time_s_this_run": time.process_time() - cpu0,
    })
    print(f"wrote inheritune_baselines.{{csv,json}}, _tests.csv and {', '.join(written)} in {time.time() - started:.0f} s")
    return methods


if __name__ == "__main__":
    main()
