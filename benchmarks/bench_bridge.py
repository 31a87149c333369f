"""Benchmark the TransformerBridge backend's evaluator against the HookedTransformer evaluator and Hugging Face SDPA.

    bash scripts/setup.sh && bash scripts/setup.sh --bridge
    cd benchmarks && OMP_NUM_THREADS=2 ../.venv-bridge/bin/python bench_bridge.py --write-docs   # ~5 min, 2 cores

Runs in the TransformerLens 4.x environment. On the same ARC-Easy rows, in the same batches, alternating round by
round: ``evaluate`` on the bridge (unhooked: the evaluator's plain path, final norm and unembedding only at the
read positions), the bridge's own forward (full logits, then the read positions), the same rows through Hugging
Face with SDPA attention (full logits, then the read positions), and
the HookedTransformer evaluator (fused attention + packed weights). HookedTransformer can't be imported beside
TransformerLens 4.x, so that one runs in a subprocess of the 3.9 environment (``--hooked-python``, default
``../.venv/bin/python``) that loads the model once and evaluates the same task, timed inside it (its loading is
not counted); the others are timed in this process. The log-likelihoods of all three are checked to agree.
Target: the bridge evaluator >= 0.8x HF SDPA throughput.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lens_heads.plumbing.settings import option
from timing import Comparison, alternate, load_average, parse_settings, print_machine, write_printed

HEADING = "TransformerBridge evaluator"
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class BridgeBench(Comparison):
    """What the benchmark times."""

    arc_n: int = option(24, "ARC-Easy items evaluated")
    hooked_python: str = option(str(ROOT / ".venv" / "bin" / "python"), "python of the TransformerLens 3.9 "
                                "environment, for the HookedTransformer evaluator ('' to leave it out)")
    hooked_worker: bool = option(False, "run as the HookedTransformer worker", hidden=True)


def task_of(s: BridgeBench):
    from lens_heads import load_task

    return load_task("arc_easy", n=s.arc_n, seed=0)


def item_logprobs(result) -> list[float]:
    return [lp for item in result.items for lp in item.logprobs]


@torch.no_grad()
def full_logits_evaluate(forward, model, task, batch_size: int) -> list[float]:
    """The evaluator's rows and batches through ``forward(tokens, mask) -> logits`` (full logits at every
    position), then log-softmax at the read positions."""
    from lens_heads.data.inputs import pad_id
    from lens_heads.data.rows import build_rows
    from lens_heads.evaluation.logprobs import batches, pad_rows

    items = list(task)
    rows = build_rows(model, items, protocol="lm-eval")
    out = [[0.0] * len(it.continuations) for it in items]
    for batch in batches(sorted(rows, key=lambda r: -len(r.tokens)), batch_size):
        tokens, mask = pad_rows(batch, pad_id(model))
        logits = forward(tokens, mask.long())
        for b, row in enumerate(batch):
            for choice, first, ids in row.reads:
                logp = torch.log_softmax(logits[b, first:first + len(ids)].float(), dim=-1)
                out[row.item][choice] = float(logp[torch.arange(len(ids)), torch.tensor(ids)].double().sum())
    return [lp for per_item in out for lp in per_item]


def hooked_worker(s: BridgeBench) -> None:
    """In the 3.9 environment: load HookedTransformer once, evaluate ``repeats`` times; print walls and values."""
    from lens_heads import evaluate, load_model

    model, task = load_model(backend="hooked"), task_of(s)
    walls, result = [], None
    for _ in range(s.repeats):
        start = time.perf_counter()
        result = evaluate(model, task, batch_size=s.batch_size, progress=False)
        walls.append(time.perf_counter() - start)
    print(json.dumps(dict(walls=walls, logprobs=item_logprobs(result), attention=result.meta["attention"])))


def run_hooked(s: BridgeBench) -> dict | None:
    if not s.hooked_python or not Path(s.hooked_python).exists():
        return None
    cmd = [s.hooked_python, str(Path(__file__).resolve()), "--hooked-worker", "--arc-n", str(s.arc_n),
           "--repeats", str(s.repeats), "--batch-size", str(s.batch_size)]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).parent,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if run.returncode:
        raise RuntimeError(f"the HookedTransformer worker failed:\n{run.stderr[-2000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    from transformers import AutoModelForCausalLM

    from lens_heads import evaluate, load_model
    from lens_heads.models.embedded import embedded_model_folder

    s = parse_settings(BridgeBench, argv, __doc__)
    if s.hooked_worker:
        return hooked_worker(s)
    started = load_average()
    torch.set_grad_enabled(False)
    bridge, task = load_model(backend="bridge"), task_of(s)
    hf = AutoModelForCausalLM.from_pretrained(embedded_model_folder(), dtype=torch.float32,
                                              attn_implementation="sdpa").eval()
    timings = alternate({
        "bridge": lambda: item_logprobs(evaluate(bridge, task, batch_size=s.batch_size, progress=False)),
        "bridge_forward": lambda: full_logits_evaluate(lambda t, m: bridge(t, attention_mask=m), bridge, task,
                                                       s.batch_size),
        "hf_sdpa": lambda: full_logits_evaluate(lambda t, m: hf(input_ids=t, attention_mask=m, use_cache=False).logits,
                                                bridge, task, s.batch_size),
    }, s.repeats, show=True)
    hooked = run_hooked(s)
    machine = print_machine(started)
    lines = report(s, timings, hooked)
    print("\n".join(lines))
    if s.write_docs:
        write_printed(HEADING, f"cd benchmarks && OMP_NUM_THREADS={torch.get_num_threads()} "
                      f"../.venv-bridge/bin/python bench_bridge.py --arc-n {s.arc_n} --repeats {s.repeats} "
                      "--write-docs", machine, "Best of the alternating rounds; the HookedTransformer evaluator "
                      "ran in a TransformerLens 3.9 subprocess after them.", [lines])


def report(s: BridgeBench, timings: dict, hooked: dict | None) -> list[str]:
    bridge, hf = timings["bridge"], timings["hf_sdpa"]
    diff = float(np.max(np.abs(np.asarray(bridge.out) - np.asarray(hf.out))))
    lines = [f"ARC-Easy {s.arc_n} items, batch size {s.batch_size}, best of {s.repeats} rounds",
             f"  bridge evaluator (unhooked)      {bridge.best:7.2f} s   {hf.best / bridge.best:5.2f}x HF SDPA",
             f"  bridge forward (full logits)     {timings['bridge_forward'].best:7.2f} s   "
             f"{hf.best / timings['bridge_forward'].best:5.2f}x HF SDPA",
             f"  Hugging Face SDPA (full logits)  {hf.best:7.2f} s   1.00x",
             f"  log-likelihoods, bridge vs HF: max difference {diff:.1e}"]
    if hooked is not None:
        best = min(hooked["walls"])
        hdiff = float(np.max(np.abs(np.asarray(bridge.out) - np.asarray(hooked["logprobs"]))))
        lines[4:4] = [f"  HookedTransformer evaluator      {best:7.2f} s   {hf.best / best:5.2f}x HF SDPA "
                      f"({hooked['attention']})"]
        lines.append(f"  log-likelihoods, bridge vs HookedTransformer: max difference {hdiff:.1e}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
