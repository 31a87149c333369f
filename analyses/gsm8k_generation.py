"""GSM8K generated with heads zeroed: the zeroing recomputed at every generated token, as the authors' patched
attention does it, beside the intact model and beside the zeroing measured through the gold answer alone.

    OMP_NUM_THREADS=1 python analyses/gsm8k_generation.py --threads 1      # lm-eval gsm8k, n=5, 10 new tokens
    python analyses/gsm8k_generation.py --n 2 --max-new-tokens 4 --no-write                      # a smoke run

The authors generate with ``use_cache=False``: every new token reruns the whole sequence, and their patched
attention scores every head on it and zeroes the heads past the threshold before the token is chosen. Here:

1. **Threshold**: ``--score`` at ``--fraction`` of the pooled (prompt, layer, head) values of the unablated scores
   of the item prompts (the first forward of each generation).
2. **Intact** greedy generation (key-value cache: the model is the same at every step), read by the task's filters
   (``gsm8k_lm_eval``: lm-eval's strict-match and flexible-extract; ``gsm8k``: the number after "answer is").
3. **Zeroing recomputed at every token** (``lens_heads.evaluation.generate.evaluate_generation`` with a
   ``threshold_zeroing`` and ``cache=False``): each step reruns prompt + tokens so far, decides per layer on that
   sequence's scores and zeroes at all its positions; the realised share counts every step.
4. **Today's reading** (``run_sweep``): the gold worked answer scored by log-likelihood with the same threshold
   deciding once per row (prompt + gold answer): bits per byte of the gold answer, intact and zeroed, paired.

Exact match under zeroing against intact is a paired difference over the same items (bootstrap interval). Costs:
wall and CPU seconds of each generation run (this process, all threads) and the tokens it generated; items are
kept in ``--out`` and reused by a rerun (costs then come from the stored items). ``--max-new-tokens`` below
lm-eval's 256 cuts long answers before their "#### N": the exact match is then of the cut text, and the record
says so.

Outputs in ``--figures``: ``gsm8k_generation.json`` (model, data, n, seed, weight basis, settings, threshold, both
generations' exact match by filter with Wilson intervals, the paired differences, realised share, costs, the gold
answer's bits per byte, how many generations the zeroing changed) and ``gsm8k_generation.csv`` (one row per item
and run: the generated text, answer by filter, match, tokens, steps and triples zeroed).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from lens_heads import load_model, load_task
from lens_heads.ablation.hooks import threshold_zeroing
from lens_heads.evaluation.generate import GenerationRecord, GenerationResult, evaluate_generation
from lens_heads.evaluation.results import mean_ci
from lens_heads.heads.distributions import thresholds
from lens_heads.heads.scoring import score_heads
from lens_heads.models.embedded import DEFAULT_MODEL
from lens_heads.models.loading import model_meta
from lens_heads.plumbing.cache import Cache
from lens_heads.plumbing.io import atomic_write_text, slug
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option
from lens_heads.stats import calling
from lens_heads.sweep.run import run_sweep

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Settings:
    """What one run measures and writes (each field is a ``--flag``)."""

    model: str = option(DEFAULT_MODEL, "model name (the embedded SmolLM2-135M by default)")
    task: str = option("gsm8k_lm_eval", "gsm8k_lm_eval (lm-eval's gsm8k) or gsm8k (8-shot chain of thought)",
                       choices=("gsm8k_lm_eval", "gsm8k"))
    n: int = option(5, "GSM8K test items, sampled by --seed")
    seed: int = option(0, "sampling seed (and the bootstrap's)")
    max_new_tokens: int = option(10, "generation budget per item (lm-eval's is 256)")
    score: str = option("AHON (LN)", "the score that zeroes heads")
    fraction: float = option(0.1, "target share of heads to zero")
    n_resamples: int = option(2000, "bootstrap replicates of the paired differences")
    threads: int | None = option(None, "torch CPU threads (default: torch's choice)", parse=int)
    out: str = option(str(ROOT / "runs" / "gsm8k_generation"), "folder of resumable items")
    figures: str = option(str(ROOT / "figures"), "where the JSON and CSV go")
    no_write: bool = option(False, "print only")


def generations(model, task, args, name: str, hooks_for, cache: bool, threshold: float | None = None
                ) -> tuple[GenerationResult, dict]:
    """Every item generated (kept one by one in --out under its id, the run and, for the zeroed run, the threshold:
    a sample of another size calibrates another one), and the summed cost of the items as they were computed."""
    cache_dir = Cache(args.out)
    records, cost = [], dict(wall_s=0.0, cpu_s=0.0, new_tokens=0, steps=0)
    for i, item in enumerate(task):
        key = dict(model=model_meta(model), item=item.id, run=name, max_new_tokens=args.max_new_tokens,
                   hooks=hooks_for is not None and f"{args.score} {args.fraction}", threshold=threshold, cache=cache)

        def compute() -> dict:
            one = replace(task, items=[item])
            hooks = [hooks_for()] if hooks_for is not None else []
            result = evaluate_generation(model, one, hooks=hooks, max_new_tokens=args.max_new_tokens, cache=cache,
                                         progress=False, first_input=i)
            return dict(record=asdict(result.items[0]), meta=result.meta)

        stored = cache_dir.json(f"{name}_{slug(item.id)}", key, compute)
        records.append(GenerationRecord(**stored["record"]))
        for k in ("wall_s", "cpu_s", "new_tokens"):
            cost[k] += stored["meta"][k]
        cost["steps"] += records[-1].zeroed[0] if records[-1].zeroed else records[-1].n_new_tokens
        print(f"[{name}] {i + 1}/{len(task)} {item.id}: {records[-1].answer!r} ({records[-1].n_new_tokens} tokens, "
              f"{stored['meta']['cpu_s']:.0f} CPU s)", flush=True)
    meta = {**stored["meta"], "wall_s": cost["wall_s"], "cpu_s": cost["cpu_s"], "new_tokens": cost["new_tokens"],
            "task": task.meta()}
    cost.update(cpu_s_per_token=cost["cpu_s"] / max(cost["new_tokens"], 1),
                wall_s_per_token=cost["wall_s"] / max(cost["new_tokens"], 1))
    return GenerationResult(task=task.name, items=records, meta=meta), cost


def paired(intact: GenerationResult, zeroed: GenerationResult, args) -> dict:
    """Zeroed minus intact exact match per reading, on the same items: bootstrap interval and permutation test over
    items, called by the one rule over the readings."""
    readings = list(intact.accuracies) or ["exact_match"]
    def correct(result, name):
        return np.array([it.matches[name] if it.matches else it.correct for it in result.items], dtype=float)
    x, y = (np.stack([correct(r, name) for name in readings]) for r in (zeroed, intact))  # [reading, item]
    tests = calling.paired_tests(x, y, readings, True, a="zeroed", b="intact", n_resamples=args.n_resamples,
                                 seed=args.seed)
    out = {}
    for k, (name, row) in enumerate(zip(readings, tests.to_dict("records"))):
        out[name] = dict(difference=row["difference"], low=row["low"], high=row["high"], p_value=row["p_value"],
                         p_adjusted=row["p_adjusted"], items_changed=int((x[k] != y[k]).sum()), verdict=row["verdict"])
    changed = sum(a.text != b.text for a, b in zip(intact.items, zeroed.items))
    return dict(method=f"percentile bootstrap over items and paired permutation test, {args.n_resamples} "
                       f"resamples, seed {args.seed}; {calling.RULE}",
                generations_changed=dict(items=changed, of=len(intact.items), what="items whose zeroed generation is "
                                         "not the intact one's (same prompt, same budget)"), **out)


def gold_bits_per_byte(model, task, scores, args) -> dict:
    """The gold answer's bits per byte, intact and with the same threshold deciding once per row (run_sweep)."""
    folder = Path(args.out) / f"sweep_{task.name}_n{len(task)}_seed{args.seed}"  # one folder per sample
    sweep = run_sweep(model, task, scores=[args.score], fractions=(0, args.fraction), calibration=scores,
                      random_baseline=False, out_dir=folder, seed=args.seed, batch_size=2)
    unit = next(u for u in sweep.units if u.mode == "threshold")
    base = {it.id: it.gold_bits_per_byte for it in sweep.baseline.items}
    change = mean_ci(np.array([it.gold_bits_per_byte - base[it.id] for it in unit.result.items]))
    return dict(intact=sweep.baseline.bits_per_byte, zeroed=unit.result.bits_per_byte, change=change.mean,
                change_low=change.ci95[0], change_high=change.ci95[1], threshold=unit.threshold,
                realised_share=unit.realised_fraction, zeroing="decided once per row (prompt + gold answer)",
                paired_method="normal approximation on per-item paired differences, 95%")


def table(intact: GenerationResult, zeroed: GenerationResult) -> pd.DataFrame:
    rows = []
    for run, result in (("intact", intact), ("zeroed, recomputed every token", zeroed)):
        for it in result.items:
            rows.append(dict(run=run, id=it.id, target=it.target.split("#### ")[-1], text=it.text, answer=it.answer,
                             correct=it.correct, **{f"{k} answer": v for k, v in it.filtered.items()},
                             **{f"{k} correct": v for k, v in it.matches.items()}, new_tokens=it.n_new_tokens,
                             stop=it.stop, steps=it.zeroed[0] if it.zeroed else None,
                             triples_zeroed=it.zeroed[1] if it.zeroed else None))
    return pd.DataFrame(rows)


def run(model, args) -> dict:
    task = load_task(args.task, n=args.n, seed=args.seed)
    start = time.perf_counter()
    scores = score_heads(model, [item.prompt for item in task], batch_size=2, progress=True)
    threshold = thresholds(scores, args.score, [args.fraction])[args.fraction]
    intact, intact_cost = generations(model, task, args, "intact", None, cache=True)
    zeroed, zeroed_cost = generations(model, task, args, "zeroed",
                                      lambda: threshold_zeroing(model, args.score, threshold), cache=False,
                                      threshold=threshold)
    record = dict(
        what="GSM8K greedy generation with heads zeroed per input on hook_z, the zeroing recomputed at every generated "
             "token (the authors' use_cache=False), beside the intact model and the gold answer's bits per byte",
        model=model_meta(model), task=task.meta(), seed=args.seed, settings=asdict(args),
        threshold=dict(score=args.score, target_fraction=args.fraction, value=threshold,
                       calibration=f"pooled unablated scores of the {len(task)} item prompts"),
        max_new_tokens=dict(value=args.max_new_tokens, lm_eval=256, note="answers longer than this are cut before "
                            "their '#### N'" if args.max_new_tokens < 256 else ""),
        intact=dict(summary=intact.summary(), cost=intact_cost, generation=intact.meta),
        zeroed=dict(summary=zeroed.summary(), cost=zeroed_cost, generation=zeroed.meta,
                    realised_share=zeroed.share_zeroed()),
        paired_difference=paired(intact, zeroed, args),
        gold_bits_per_byte=gold_bits_per_byte(model, task, scores, args),
        wall_s_this_run=time.perf_counter() - start)
    print({k: record[k] for k in ("paired_difference", "gold_bits_per_byte")})
    print(f"intact {intact.summary()} cost {intact_cost}\nzeroed {zeroed.summary()} cost {zeroed_cost} "
          f"share {zeroed.share_zeroed():.4f}")
    if not args.no_write:
        figures = Path(args.figures)
        write_record(figures / "gsm8k_generation.json", record)
        atomic_write_text(figures / "gsm8k_generation.csv", table(intact, zeroed).to_csv(index=False))
    return record


def main(argv=None) -> None:
    args = from_args(Settings, argv, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    if args.threads:
        torch.set_num_threads(args.threads)
    run(load_model(args.model), args)


if __name__ == "__main__":
    main()
