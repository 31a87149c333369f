"""The default report's ablation stage one unit at a time against stacked units per forward, side by side in one
process on the embedded model.

    OMP_NUM_THREADS=1 nice python benchmarks/bench_stacked.py [--n 16 --stack 4 --repeats 2 --threads 1]

What the report's ablation stage runs (``lens_heads.report.sweep_stages.ablation_stage``): ``run_sweep`` of
ARC-Easy's ``--n`` validation items (sampled by ``--seed``) under all twelve scores at the report's target fractions
(``--fractions``),
the thresholds from the scores stage's unablated scores of the same rows (computed once, untimed), each run into a
fresh folder: ``stack=1`` (one unit at a time) and ``stack=--stack``, alternated (A B A B ...). Wall and process CPU
seconds per run (medians; on a shared machine the CPU seconds of a one-thread run are what an idle core takes), the
ratio, the load average, and whether the two give every unit the same records: predictions equal, the largest
log-likelihood difference, and the realised shares equal. Writes a JSON record with its provenance to ``--out``.

:func:`compare_units` is what ``benchmarks/gpu_check.py`` calls for its stacked sweep (units per second, stacked
against one at a time, on any model and task).
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import option
from timing import alternate, load_average, machine_line, parse_settings, repeats_option, set_threads, threads_option

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class StackedBench:
    """What the benchmark measures."""

    n: int = option(16, "ARC-Easy validation items (the report's default is 40)")
    fractions: str = option("0,0.1,0.2,0.3", "target shares of heads zeroed, comma-separated (the report's default)")
    stack: int = option(4, "units per forward of the stacked run")
    batch_size: int = option(8, "rows per unit per forward (the report's default)")
    repeats: int = repeats_option(2)
    seed: int = option(0, "seed of the item sample and of the random baseline (the report's default)")
    threads: int | None = threads_option()
    out: str = option("docs/records/bench_stacked.json", "the JSON record written (relative to the repository)")


def agreement(one, stacked) -> dict:
    """Unit by unit, whether two sweeps of one plan give the same records: predictions equal (units x items), the
    largest log-likelihood difference (nats) and whether every realised share is equal."""
    same, total, worst, shares = 0, 0, 0.0, True
    for a, b in zip(one.units, stacked.units):
        pa, pb = (np.array([it.chosen(u.result.primary) for it in u.result.items]) for u in (a, b))
        same, total = same + int((pa == pb).sum()), total + len(pa)
        la, lb = (np.concatenate([np.asarray(it.logprobs, float) for it in u.result.items]) for u in (a, b))
        worst = max(worst, float(np.abs(la - lb).max()))
        shares = shares and a.realised_fraction == b.realised_fraction and a.item_zeroed == b.item_zeroed
    return dict(predictions_equal=same, predictions=total, max_abs_loglik_diff=worst, shares_equal=shares)


def compare_units(model, task, *, stack: int, repeats: int = 1, **sweep) -> dict:
    """``run_sweep(model, task, **sweep)`` one unit at a time and with ``stack`` units per forward, alternated
    ``repeats`` times, each run into a fresh folder: per way its wall and CPU seconds (medians) and units per wall
    second, the stacked/one ratio, and :func:`agreement`. ``sweep``: run_sweep's arguments (scores, fractions,
    calibration: a HeadScores keeps the scoring pass out of the timing, batch_size, seed)."""
    from lens_heads.sweep.run import run_sweep

    def way(k: int):
        def run():
            with tempfile.TemporaryDirectory() as folder:
                return run_sweep(model, task, out_dir=folder, stack=k, progress=False, **sweep)
        return run

    timings = alternate({"one": way(1), "stacked": way(stack)}, repeats)
    one, stacked = timings["one"], timings["stacked"]
    n_units = len(one.out.units)
    ways = {name: dict(wall_s=t.wall, cpu_s=t.cpu, walls=t.walls, cpus=t.cpus, units_per_s=n_units / t.wall)
            for name, t in timings.items()}
    return dict(units=n_units, stack=stack, **ways, wall_ratio=one.wall / stacked.wall,
                cpu_ratio=one.cpu / stacked.cpu, **agreement(one.out, stacked.out))


def main(argv=None) -> None:
    s = parse_settings(StackedBench, argv, __doc__)
    set_threads(s.threads)
    from lens_heads import load_model, load_task
    from lens_heads.evaluation.eval_settings import EvalSettings
    from lens_heads.heads.scores import SCORE_NAMES
    from lens_heads.heads.scoring import score_heads

    started = load_average()
    fractions = tuple(float(f) for f in s.fractions.split(","))
    model = load_model()
    task = load_task("arc_easy", split="validation", n=s.n, seed=s.seed)
    settings = EvalSettings(batch_size=s.batch_size)
    scores = score_heads(model, task, settings=settings, progress=False)  # the scores stage's, untimed
    out = compare_units(model, task, stack=s.stack, repeats=s.repeats, scores=list(SCORE_NAMES),
                        fractions=fractions, calibration=scores, settings=settings, seed=s.seed)
    machine = machine_line(started)
    print(f"machine: {machine}")
    print(f"{out['units']} units on {s.n} ARC-Easy items, batch {s.batch_size} rows per unit")
    for name in ("one", "stacked"):
        w = out[name]
        print(f"  {name:8s} wall {w['wall_s']:7.1f} s  CPU {w['cpu_s']:7.1f} s  {w['units_per_s']:.3f} units/s")
    print(f"  stacked ({s.stack} units per forward) vs one at a time: {out['wall_ratio']:.2f}x wall, "
          f"{out['cpu_ratio']:.2f}x CPU")
    print(f"  predictions equal {out['predictions_equal']}/{out['predictions']}, largest log-likelihood difference "
          f"{out['max_abs_loglik_diff']:.1e} nats, realised shares equal: {out['shares_equal']}")
    command = "OMP_NUM_THREADS=1 python benchmarks/bench_stacked.py " + " ".join(sys.argv[1:] if argv is None
                                                                                else argv)
    write_record(ROOT / s.out, dict(command=command.strip(), machine=machine,
                                    load_average=dict(start=started, end=load_average()), settings=asdict(s),
                                    model=model.cfg.model_name, task="arc_easy", split="validation",
                                    scores=list(SCORE_NAMES), fractions=list(fractions), **out))
    print(f"wrote {s.out}")


if __name__ == "__main__":
    main()
