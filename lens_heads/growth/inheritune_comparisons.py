"""The comparisons of analyses/inheritune_baselines.py: every baseline's final loss, steps to the same loss and
zero-shot accuracy against Inheritune's, paired over training seeds, validation windows and items, each table called
by the project's rule (`lens_heads.stats.calling`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lens_heads.growth.inheritune_result import InherituneResult, Stage
from lens_heads.stats.calling import call_table, paired_tests

INHERITUNE = "Inheritune"


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
