"""GSM8K on the embedded model: exact match by greedy generation, and what zeroing heads costs in the gold answer's
bits per byte, a continuous metric that a model at 0% exact match can still lose.

    python analyses/gsm8k.py --threads 1      # embedded SmolLM2-135M, n=30, AHON (LN) and random at 10/20/30%
    python analyses/gsm8k.py --n 3 --max-new-tokens 16 --fractions 0,.1 --scores ""   # a smoke run

1. **Exact match** (``lens_heads.evaluation.generate.evaluate_generation``): the shipped 8-shot chain-of-thought prompt, greedy
   generation with TransformerLens's key-value cache until a blank line or "Question:" (or ``--max-new-tokens``),
   the answer's final number against the gold one, with its Wilson interval. The model runs intact here.
2. **Bits per byte of the gold answer** (``lens_heads.sweep.run.run_sweep`` on the same items): the gold
   chain-of-thought answer scored by log-likelihood on lm-eval's rows, intact, with heads zeroed per input by each
   of ``--scores`` at each target share (thresholds from the unablated scores of the evaluated rows, as in
   ``analyses/sweep.py``), and with random zeroing. Per point: the realised share zeroed, the mean bits per byte,
   and its paired change from the intact model on the same items with a 95% interval. Units are kept in ``--out``
   and reused by a rerun.

What zeroing means here: every forward of step 2 is one whole row (the prompt and the gold answer), so a per-input
threshold zeroing decides on that row's scores, as the authors' patched attention does in the forward that scores an
answer. Zeroing while generating is the other reading: ``lens_heads.evaluation.generate`` with a zeroing and ``cache=False``
reruns the sequence at every step and recomputes the scores each time, as the authors do; at 8-shot prompt lengths
that costs a full forward per generated token, so this script measures the loss through the gold answer instead.

Outputs in ``--figures``: ``gsm8k.json`` (model, data, n, seed, weight basis, settings, exact match, the bits-per-byte
table), ``gsm8k.csv`` (the table) and ``gsm8k.png/.html`` (change of bits per byte and of log P(gold) vs % zeroed).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from lens_heads import load_model, load_task
from lens_heads.evaluation.generate import GenerationRecord, GenerationResult, evaluate_generation
from lens_heads.evaluation.results import mean_ci
from lens_heads.heads.scores import score_names
from lens_heads.models.embedded import DEFAULT_MODEL
from lens_heads.models.loading import model_meta
from lens_heads.plumbing.cache import Cache
from lens_heads.plumbing.io import atomic_write_text
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option
from lens_heads.sweep.run import run_sweep
from lens_heads.viz.export import save_figure
from lens_heads.viz.sweep_figures import ablation_curves

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class GSM8KSettings:
    """What one run measures and writes (each field is a ``--flag``)."""

    model: str = option(DEFAULT_MODEL, "model name (the embedded SmolLM2-135M by default)")
    n: int = option(30, "GSM8K test items, sampled by --seed")
    seed: int = option(0, "sampling and random-zeroing seed")
    max_new_tokens: int = option(256, "generation budget per item")
    scores: tuple[str, ...] = option(("AHON (LN)",), "comma-separated scores that zero heads ('' for none)",
                                     parse=score_names)
    fractions: tuple[float, ...] = option((0.0, 0.1, 0.2, 0.3), "target shares of heads to zero")
    batch_size: int = option(4, "forward rows per batch (8-shot rows are ~900 tokens)")
    threads: int | None = option(None, "torch CPU threads (default: torch's choice)", parse=int)
    out: str = option(str(ROOT / "runs" / "gsm8k"), "folder of resumable units and the generations")
    figures: str = option(str(ROOT / "figures"), "where the table and figure go")
    no_png: bool = option(False, "write the HTML figure only (PNG needs Chromium)")


def exact_match(model, task, args) -> GenerationResult:
    """Greedy generation on every item, kept in --out (a rerun with the same model, items and budget reuses it)."""
    key = dict(model=model_meta(model), items=[it.id for it in task], max_new_tokens=args.max_new_tokens)

    def compute() -> dict:
        result = evaluate_generation(model, task, max_new_tokens=args.max_new_tokens, cache=True)
        return dict(items=[asdict(it) for it in result.items], meta=result.meta)

    stored = Cache(args.out).json("generations", key, compute)
    return GenerationResult(task=task.name, items=[GenerationRecord(**it) for it in stored["items"]],
                            meta=stored["meta"])


def bits_per_byte_table(sweep) -> pd.DataFrame:
    """The sweep's table with each point's mean gold bits per byte and its paired change (95% interval)."""
    table = sweep.to_dataframe()
    base = {it.id: it.gold_bits_per_byte for it in sweep.baseline.items}
    by_point = {(u.curve.label, u.target_fraction): u for u in sweep.units if u.curve is not None}
    rows = []
    for _, row in table.iterrows():
        unit = by_point.get((row["curve"], row["target_fraction"]))
        result = unit.result if unit is not None else sweep.baseline
        change = mean_ci(np.array([it.gold_bits_per_byte - base[it.id] for it in result.items]))
        rows.append(dict(bits_per_byte=result.bits_per_byte,
                         bits_per_byte_change=change.mean, bits_per_byte_low=change.ci95[0],
                         bits_per_byte_high=change.ci95[1]))
    keep = ["curve", "score", "mode", "target_fraction", "threshold", "realised_fraction", "gold_logprob_change",
            "gold_logprob_low", "gold_logprob_high", "n"]
    return pd.concat([table[keep].reset_index(drop=True), pd.DataFrame(rows)], axis=1)


def write_outputs(model, task, generations: GenerationResult, sweep, table: pd.DataFrame, args) -> None:
    figures = Path(args.figures)
    figures.mkdir(parents=True, exist_ok=True)
    meta = model_meta(model)
    em, (low, high) = generations.accuracy, generations.ci95
    base_bpb = sweep.baseline.bits_per_byte
    atomic_write_text(figures / "gsm8k.csv", table.to_csv(index=False, float_format="%.6g"))
    write_record(figures / "gsm8k.json", dict(
        what="GSM8K: exact match of greedy generation (intact model), and the gold answer's bits per byte with heads "
             "zeroed per input on hook_z (random zeroing beside)",
        model=meta, task=task.meta(), seed=args.seed, scores=args.scores, fractions=args.fractions,
        exact_match=generations.summary(), generation=generations.meta,
        generated_answers=[dict(id=it.id, target=it.target, answer=it.answer, correct=it.correct,
                                n_new_tokens=it.n_new_tokens, stop=it.stop) for it in generations.items],
        intact_bits_per_byte=base_bpb, paired_method="normal approximation on per-item paired differences, 95%",
        sweep_meta=sweep.meta, table=table.to_dict(orient="records")))
    title = (f"{meta['name']}, GSM8K {task.split} {task.shots}-shot CoT, n={len(task)}, seed {args.seed}, "
             f"{meta['weight_basis'].split(' ')[0]} weights: exact match {100 * em:.1f}% [{100 * low:.1f}, "
             f"{100 * high:.1f}]; intact {base_bpb:.3f} bits/byte")
    save_figure(ablation_curves(table, baseline=float("nan"), chance=0.0, title=title), figures / "gsm8k",
                png=not args.no_png)


def run(model, args) -> pd.DataFrame:
    """Both measurements on ``model``, their outputs written; the bits-per-byte table."""
    task = load_task("gsm8k", n=args.n, seed=args.seed)
    start = time.perf_counter()
    generations = exact_match(model, task, args)
    em, (low, high) = generations.accuracy, generations.ci95
    print(f"[gsm8k] exact match {100 * em:.1f}% [{100 * low:.1f}, {100 * high:.1f}] on n={generations.n} "
          f"({time.perf_counter() - start:.0f} s)")
    sweep = run_sweep(model, task, scores=args.scores, fractions=args.fractions, out_dir=Path(args.out) / "sweep",
                      seed=args.seed, batch_size=args.batch_size)
    table = bits_per_byte_table(sweep)
    write_outputs(model, task, generations, sweep, table, args)
    print(table[["curve", "target_fraction", "realised_fraction", "bits_per_byte", "bits_per_byte_change",
                 "bits_per_byte_low", "bits_per_byte_high"]].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"done in {time.perf_counter() - start:.0f} s")
    return table


def parse_args(argv=None) -> GSM8KSettings:
    return from_args(GSM8KSettings, argv, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    run(load_model(args.model), args)


if __name__ == "__main__":
    main()
