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


def readded_lazy_layers(record: dict) -> dict[int, list[int]]:
    """Per grown student size every seed reached, the layers it took from the reference that the reference's rank
    profile (the paper's aggregation) marks lazy: the blocks the question "do lazy layers stay lazy?" is about."""
    lazy = {i for i, flag in enumerate(record["reference"]["rank"]["averaged"]["lazy"]) if flag}
    start = record["config"]["start_layers"]
    return {n: sorted(lazy & set(range(start, n))) for n in shared_sizes(record) if n > start}


def lazy_rank_tests(record: dict, n_resamples: int = 2000) -> pd.DataFrame:
    """Does a re-added lazy layer's attention rank rise with training? Per grown size and re-added lazy layer, the
    rank after the stage's training minus the rank at growth (the grown model before training) and minus the
    reference's rank of the same block, each input's rank being the max over the layer's heads (``higher``: the
    rank rose); paired over the rank inputs (each input's rank averaged over the seeds) and over seeds (each seed's
    mean over inputs). Each unit's rows are one Benjamini-Hochberg family; empty when nothing grew."""
    seeds = sorted(int(s) for s in record["growth"])
    sizes = readded_lazy_layers(record)
    reference = np.asarray(record["reference"]["rank"]["input_layer_max"], dtype=float)
    tables = []
    for unit in ("rank input (mean over seeds)", "training seed"):
        x, y, labels, rows = [], [], [], []
        for n, layers in sizes.items():
            stages = [next(s for s in record["stages"] if s["seed"] == seed and s["kind"] == "student" and
                           s["n_layers"] == n) for seed in seeds]
            after = np.asarray([s["rank"]["input_layer_max"] for s in stages], dtype=float)  # [seed, input, layer]
            before = np.asarray([s["rank_at_init"]["input_layer_max"] for s in stages], dtype=float)
            for layer in layers:
                for other, values in (("at growth", before[:, :, layer]),
                                      ("the reference", np.tile(reference[:, layer], (len(seeds), 1)))):
                    a = after[:, :, layer]
                    x.append(a.mean(axis=1) if unit == "training seed" else a.mean(axis=0))
                    y.append(values.mean(axis=1) if unit == "training seed" else values.mean(axis=0))
                    labels.append(f"layer {layer} of Inheritune {n}L: after training vs {other}")
                    rows.append({"n_layers": n, "layer": layer, "b": other})
        if not labels:
            continue
        tests = paired_tests(np.asarray(x), np.asarray(y), labels, None, n_resamples=n_resamples,
                             quantity="attention rank (max over the layer's heads)", unit=unit, a="after training")
        tests["b"] = [r["b"] for r in rows]
        tests["n_layers"] = [r["n_layers"] for r in rows]
        tests["layer"] = [r["layer"] for r in rows]
        tables.append(call_table(tests.drop(columns=["p_adjusted", "verdict"])))
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
