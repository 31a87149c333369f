"""The growth loop's comparisons by the calling rule (`lens_heads.stats.calling`): at every student size all seeds
reached, the Inheritune student's final loss against the same-size random init, the same-FLOPs scratch and the
reference, paired over validation windows (each window's loss averaged over the seeds) and over seeds (the unit
that is resampled: with 3 seeds the smallest two-sided permutation p is 0.25, so nothing is called over seeds)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lens_heads.stats.calling import call_table, paired_tests

OTHERS = {"random": "same-size random init", "same_flops": "same-FLOPs scratch", "reference": "the reference"}


def shared_sizes(record: dict) -> list[int]:
    """The student sizes every seed trained."""
    sizes = [{p["n_layers"] for p in g["stages"]} for g in record["growth"].values()]
    return sorted(set.intersection(*sizes)) if sizes else []


def _losses(record: dict, seed: int, kind: str, n: int) -> tuple[float, list[float]]:
    if kind == "reference":
        ref = record["reference"]
        return ref["val_loss"], ref["window_losses"]
    s = next(s for s in record["stages"] if s["seed"] == seed and s["kind"] == kind and s["n_layers"] == n)
    return s["val_loss"], s["window_losses"]


def growth_tests(record: dict, n_resamples: int = 2000) -> pd.DataFrame:
    """One row per (size, other model, unit): the difference other − Inheritune in final loss (> 0: Inheritune
    lower), its interval, p-values and the rule's verdict; each unit's rows are one Benjamini-Hochberg family."""
    seeds = sorted(int(s) for s in record["growth"])
    tables = []
    for unit in ("validation window (mean over seeds)", "training seed"):
        x, y, labels, rows = [], [], [], []
        for n in shared_sizes(record):
            student = [_losses(record, s, "student", n) for s in seeds]
            for kind, name in OTHERS.items():
                other = [_losses(record, s, kind, n) for s in seeds]
                if unit == "training seed":
                    x.append([o[0] for o in other])
                    y.append([s[0] for s in student])
                else:
                    x.append(np.mean([o[1] for o in other], axis=0))
                    y.append(np.mean([s[1] for s in student], axis=0))
                labels.append(f"{name} vs Inheritune {n}L")
                rows.append({"n_layers": n, "other": name})
        if not labels:
            continue
        tests = paired_tests(np.asarray(x, dtype=float), np.asarray(y, dtype=float), labels, higher_is_better=False,
                             n_resamples=n_resamples, quantity="final validation loss", unit=unit, b="Inheritune")
        tests["a"] = [r["other"] for r in rows]
        tests["n_layers"] = [r["n_layers"] for r in rows]
        tables.append(call_table(tests.drop(columns=["p_adjusted", "verdict"])))
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
