"""The evaluator with its products by oneDNN-blocked weights against the same evaluator with plain ``F.linear``
products, alternating in one process (:mod:`lens_heads.evaluation.blocked_linear`; oneDNN off by torch's own flag).

    OMP_NUM_THREADS=2 python benchmarks/bench_blocked.py --write     # docs/records/blocked_linear.json, ~4 min

``lh.evaluate`` on the embedded model, batch 8: ARC-Easy (``--arc-n`` items, 0-shot) and MMLU 5-shot (``--mmlu-n``
questions), each way ``--repeats`` times; the fastest of each is kept. The log-likelihoods of the two ways are
compared item by item. The record names the CPU and the load average (read the ratios, measured side by side).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import lens_heads as lh
from lens_heads.plumbing.provenance import code_commit
from lens_heads.plumbing.settings import option
from timing import cpu_description, load_average, parse_settings, print_and_write

RECORD = Path(__file__).resolve().parents[1] / "docs" / "records" / "blocked_linear.json"
WAYS = {"blocked (oneDNN)": True, "plain (F.linear)": False}


@dataclass(frozen=True)
class BlockedSettings:
    """What the comparison runs."""

    arc_n: int = option(100, "ARC-Easy items (seed 0)")
    mmlu_n: int = option(24, "MMLU 5-shot questions (seed 0)")
    repeats: int = option(2, "alternating rounds")
    write: bool = option(False, "write docs/records/blocked_linear.json")


def main(argv=None) -> None:
    s = parse_settings(BlockedSettings, argv, __doc__)
    torch.set_grad_enabled(False)
    started = load_average()
    model = lh.load_model()
    tasks = {"arc_easy": lh.load_task("arc_easy", n=s.arc_n, seed=0), "mmlu": lh.load_task("mmlu", n=s.mmlu_n, seed=0)}
    seconds: dict[str, dict[str, list[float]]] = {t: {w: [] for w in WAYS} for t in tasks}
    logliks: dict[str, dict[str, list]] = {t: {} for t in tasks}
    for _ in range(s.repeats):
        for way, enabled in WAYS.items():
            for name, task in tasks.items():
                with torch.backends.mkldnn.flags(enabled=enabled):
                    start = time.perf_counter()
                    result = lh.evaluate(model, task, batch_size=8, progress=False)
                    seconds[name][way].append(time.perf_counter() - start)
                logliks[name][way] = [np.asarray(item.logprobs, float) for item in result.items]
    blocked, plain = WAYS
    record = dict(
        cpu=cpu_description(), commit=code_commit(), load_average=dict(start=started, end=load_average()),
        settings=dict(arc_n=s.arc_n, mmlu_n=s.mmlu_n, repeats=s.repeats, batch_size=8),
        seconds={t: {w: [round(x, 3) for x in v] for w, v in ways.items()} for t, ways in seconds.items()},
        blocked_speedup={t: round(min(ways[plain]) / min(ways[blocked]), 3) for t, ways in seconds.items()},
        max_loglik_difference={t: max(float(np.abs(a - b).max()) for a, b in zip(ways[blocked], ways[plain]))
                               for t, ways in logliks.items()},
    )
    print_and_write(record, RECORD, s.write)


if __name__ == "__main__":
    main()
