"""Healed, and compared with Inheritune: drop k blocks of the model four ways, heal each by a short continued
training on the offline corpus, and compare them at equal size and compute.

Arms (``lh.removal_arms``): the lazy layers (the rank profile's), the k lowest Block Influence, k random layers (a
draw per seed) and Inheritune's truncation (the first ``n_layers - k`` layers kept). Each arm is pruned
(``lh.prune``, whole blocks), reloaded and trained with one ``TrainConfig`` per seed (same steps, tokens and
batches for every arm; the seed sets the batch order). Measured: validation loss against steps (the corpus's
held-out split), the final loss per validation window, and zero-shot accuracy of the healed model on the task's
items; the unpruned model is evaluated once as the reference.

Comparisons (``lens_heads.stats.calling``): each arm against the Inheritune truncation, paired over validation
windows (final loss, mean over seeds; lower is better) and over task items (correct, mean over seeds), one family
of tests called by the one rule. Layer scores come from ``figures/layers_<task>.json`` where ``analyses/layers.py``
recorded them, else they are computed on the task's items.

Arms resume from ``--out`` (a finished arm reloads its weights and its saved evaluation). Writes
``figures/heal[_<model>]_<task>.json``, ``.csv`` (one row per arm, seed and logged step) and ``.png``/``.html``
(validation loss against steps).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from lens_heads import evaluate, layer_scores, load_model, load_task
from lens_heads.evaluation.results import EvalResult
from lens_heads.experiments.healing import ARMS, heal, removal_arms
from lens_heads.experiments.layer_ranking import LayerScores
from lens_heads.experiments.task_runs import recorded_name
from lens_heads.models.embedded import cache_dir
from lens_heads.models.loading import model_meta
from lens_heads.plumbing.io import atomic_write_json, atomic_write_text
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option
from lens_heads.stats import calling
from lens_heads.training.config import TrainConfig
from lens_heads.training.corpus import load_corpus
from lens_heads.training.objectives import lm_loss
from lens_heads.training.options import train_options
from lens_heads.training.windows import eval_windows
from lens_heads.viz.export import save_figure

ROOT = Path(__file__).resolve().parents[1]

REFERENCE = "inheritune"


@dataclass(frozen=True)
class HealSettings(train_options(leave_out=("seed", "log_every", "checkpoint_every"), steps=30, batch_size=4,
                                 seq_len=128, lr=1e-4, min_lr=1e-5, warmup_steps=3, eval_every=10, eval_batches=2)):
    """One healing comparison (each field is a ``--flag``)."""

    model: str = option("smollm2-135m", "model name (the embedded SmolLM2-135M by default)")
    task: str = option("arc_easy", "zero-shot task")
    n: int = option(50, "task items", parse=int)
    split: str = option("validation", "task split")
    k: int | None = option(None, "blocks to remove (default: as many as the lazy layers)", parse=int)
    seeds: tuple[int, ...] = option((0, 1), "comma-separated seeds (batch order; the random arm's draw)",
                                    parse=lambda s: tuple(int(x) for x in s.split(",")))
    windows: int = option(16, "validation windows of the final per-window losses the tests pair", parse=int)
    out: str = option(str(cache_dir() / "heal"), "resumable run folder")
    figures: str = option(str(ROOT / "figures"), "where layer scores are read and results go")
    threads: int | None = option(None, "torch CPU threads", parse=int)
    no_png: bool = option(False, "write HTML figures only (PNG needs Chromium)")

    def seed_config(self, seed: int) -> TrainConfig:
        """The training settings of one seed's arms (a record every validation step)."""
        return self.train_config(log_every=self.eval_every, checkpoint_every=max(1, self.eval_every), seed=seed)


@torch.no_grad()
def window_losses(model, corpus, n: int, seq_len: int) -> list[float]:
    """The loss of each of ``n`` fixed validation windows, evenly spaced over the held-out split."""
    windows = eval_windows(corpus.val, n, seq_len).to(model.cfg.device)
    return [lm_loss(model, w[None]).item() for w in windows]


def evaluated(model, task, path: Path) -> EvalResult:
    """``evaluate`` once per arm: the saved records of a finished arm are read back."""
    if path.exists():
        return EvalResult.from_dict(json.loads(path.read_text()))
    result = evaluate(model, task, progress=False)
    atomic_write_json(path, result.to_dict())
    return result


def scores_for(model, task, s: HealSettings) -> tuple[LayerScores, str]:
    path = Path(s.figures) / f"layers_{recorded_name(s.model, s.task)}.json"
    if path.exists():
        return LayerScores.from_dict(json.loads(path.read_text())["layer_scores"]), f"recorded in {path.name}"
    return layer_scores(model, task, progress=False), "computed on the task's items"


def run(s: HealSettings) -> dict:
    if s.threads:
        torch.set_num_threads(s.threads)
    t0 = time.time()
    out = Path(s.out) / recorded_name(s.model, s.task)
    model = load_model(s.model)
    task = load_task(s.task, n=s.n, split=s.split)
    corpus = load_corpus("sotu", tokenizer=model.tokenizer)
    scores, scores_source = scores_for(model, task, s)
    full = evaluated(model, task, out / "full_eval.json")
    rows, windows, correct, arms_by_seed = [], {}, {}, {}
    for seed in s.seeds:
        arms = removal_arms(scores, s.k, seed=seed)
        arms_by_seed[seed] = {a: list(v) for a, v in arms.items()}
        cfg = s.seed_config(seed)
        for arm in ARMS:
            folder = out / f"{arm}_seed{seed}"
            healed = heal(model, arms[arm], corpus, cfg, out_dir=folder, progress=False)
            losses_path = folder / "window_losses.json"
            if not losses_path.exists():
                atomic_write_json(losses_path, window_losses(healed.model, corpus, s.windows, s.seq_len))
            windows[arm, seed] = json.loads(losses_path.read_text())
            result = evaluated(healed.model, task, folder / "eval.json")
            correct[arm, seed] = [float(it.correct("sum")) for it in result.items]
            for h in healed.result.history:
                if "val_loss" in h:
                    rows.append(dict(arm=arm, seed=seed, removed=" ".join(map(str, arms[arm])), step=h["step"],
                                     tokens_seen=h["tokens_seen"], val_loss=h["val_loss"],
                                     accuracy=result.accuracy if h["step"] == s.steps else np.nan,
                                     **{f"budget_{k}": v for k, v in healed.budget().items()}))
            del healed
    table = pd.DataFrame(rows)
    others = [a for a in ARMS if a != REFERENCE]

    def mean_over_seeds(values: dict, arm: str) -> np.ndarray:
        return np.mean([values[arm, seed] for seed in s.seeds], axis=0)

    loss_tests = calling.paired_tests(np.stack([mean_over_seeds(windows, a) for a in others]),
                                      np.stack([mean_over_seeds(windows, REFERENCE)] * len(others)), others,
                                      higher_is_better=False, b=REFERENCE, outcome="final validation loss",
                                      metric="val_loss")
    acc_tests = calling.paired_tests(np.stack([mean_over_seeds(correct, a) for a in others]),
                                     np.stack([mean_over_seeds(correct, REFERENCE)] * len(others)), others,
                                     higher_is_better=True, b=REFERENCE, outcome="accuracy",
                                     metric="accuracy")
    tests = calling.call_table(pd.concat([loss_tests, acc_tests], ignore_index=True).assign(a=lambda d: d["k"]))
    tests["sentence"] = [calling.sentence(r, r["outcome"], ".3f", lower_is_better=r["outcome"] != "accuracy")
                         for r in tests.to_dict("records")]
    final = table[table.step == s.steps]
    summary = {arm: dict(removed=sorted({tuple(arms_by_seed[seed][arm]) for seed in s.seeds}),
                         val_loss_start=float(table[(table.arm == arm) & (table.step == 0)].val_loss.mean()),
                         val_loss=float(final[final.arm == arm].val_loss.mean()),
                         accuracy=float(np.mean(mean_over_seeds(correct, arm))))
               for arm in ARMS}
    return dict(
        what="k blocks removed four ways and healed by continued training at equal steps and tokens; each arm "
             "against Inheritune's truncation (first layers kept), paired over validation windows and task items",
        model=s.model, weight_basis=model_meta(model).get("weight_basis"), model_meta=model_meta(model),
        data=dict(task=task.meta() if hasattr(task, "meta") else s.task, corpus=dict(corpus.meta)),
        n=len(task), n_windows=s.windows, seeds=list(s.seeds), steps=s.steps,
        tokens_per_step=s.batch_size * s.seq_len, chance=full.chance, full_accuracy=full.accuracy,
        n_layers=scores.n_layers, k=len(next(iter(arms_by_seed.values()))["lazy"]),
        lazy_layers=[int(i) for i in np.flatnonzero(scores.lazy)], layer_scores_source=scores_source,
        arms=arms_by_seed, summary=summary, tests=tests.to_dict("records"), settings=asdict(s),
        table=table.to_dict("records"), cost=dict(wall_s=round(time.time() - t0, 1)))


def loss_figure(table: pd.DataFrame, title: str) -> go.Figure:
    fig = go.Figure()
    for arm, part in table.groupby("arm", sort=False):
        stats = part.groupby("step").val_loss.agg(["mean", "min", "max"]).reset_index()
        fig.add_trace(go.Scatter(x=stats["step"], y=stats["mean"], name=arm, mode="lines+markers",
                                 error_y=dict(type="data", symmetric=False, array=stats["max"] - stats["mean"],
                                              arrayminus=stats["mean"] - stats["min"])))
    fig.update_layout(title=title, xaxis_title="training step", yaxis_title="validation loss (mean, seed range)",
                      template="plotly_white", width=720, height=440)
    return fig


def main(argv=None) -> None:
    s = from_args(HealSettings, argv, description=__doc__.split("\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    result = run(s)
    stem = Path(s.figures) / f"heal_{recorded_name(s.model, s.task)}"
    write_record(stem.with_suffix(".json"), result)
    table = pd.DataFrame(result["table"])
    atomic_write_text(stem.with_suffix(".csv"), table.to_csv(index=False))
    save_figure(loss_figure(table, f"Healing {result['k']} removed blocks of {s.model}"), stem, png=not s.no_png)
    for t in result["tests"]:
        print(t["sentence"])


if __name__ == "__main__":
    main()
