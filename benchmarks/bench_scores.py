"""Cost of scoring every head in one streaming pass, against a plain forward and the naive cache-then-compute.

    python benchmarks/bench_scores.py [--batch 8 --seq 512 --rounds 2] [--write-docs]

Methods, all under torch.no_grad on the same token batch (random ids after a BOS, no padding):
  plain        model(tokens): a plain forward returning logits (what the issue compares against)
  plain-trunk  model(tokens, stop_at_layer=n_layers): the blocks only, no unembedding (the work scoring must do)
  scoring      lens_heads.score_heads: hooks on hook_v/hook_pattern/hook_z reduce each layer and drop it
  naive        model.run_with_cache(tokens, names_filter=hook_v|hook_pattern|hook_z), then the same
               scores_of_layer on the cache (names_filter keeps the naive run as small as it can be)

Time: median wall time over ``--rounds`` interleaved rounds in this process (after a short warm-up forward
on one 64-token input).
Memory: each method runs once in a fresh subprocess that loads the model, trims the allocator, resets the kernel's
peak-RSS counter (``echo 5 > /proc/self/clear_refs``, Linux) and reads ``VmHWM`` after the method: the peak
resident memory of the whole process during that method (weights included); "delta" is that peak minus the RSS
just before. Peak RSS since process start (``ru_maxrss``) would be dominated by model loading (~3 GB), and
tracemalloc does not see torch's allocations, hence this set-up.
"""

from __future__ import annotations

import ctypes
import gc
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from lens_heads.plumbing.settings import option
from timing import (
    alternate,
    load_average,
    machine_line,
    parse_settings,
    rounds_option,
    write_docs_option,
    write_section,
)

METHODS = ("plain", "plain-trunk", "scoring", "naive")
ROOT = Path(__file__).resolve().parents[1]
SECTION = "Scoring pass"


@dataclass(frozen=True)
class ScoresBench:
    """What the benchmark times; ``--memory-child`` is what the memory measurement passes to its fresh
    processes."""

    batch: int = option(8, "inputs in the batch")
    seq: int = option(512, "tokens per input")
    rounds: int = rounds_option(2)
    write_docs: bool = write_docs_option(SECTION)
    memory_child: str | None = option(None, "the method whose peak memory this process measures", parse=str,
                                      choices=METHODS, hidden=True)



def make_tokens(model, batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(100, model.cfg.d_vocab, (batch, seq), generator=g)
    bos = model.tokenizer.bos_token_id if model.tokenizer is not None else None
    if bos is not None:
        tokens[:, 0] = bos
    return tokens


def runner(model, tokens, method: str):
    from lens_heads.heads.scoring import score_heads

    L = model.cfg.n_layers
    mask = torch.ones(tokens.shape, dtype=torch.bool)

    def plain():
        with torch.no_grad():
            return model(tokens)

    def plain_trunk():
        with torch.no_grad():
            return model(tokens, stop_at_layer=L)

    def scoring():
        return score_heads(model, tokens, batch_size=tokens.shape[0], progress=False).values

    return {"plain": plain, "plain-trunk": plain_trunk, "scoring": scoring,
            "naive": lambda: naive_scores(model, tokens, mask)}[method]


def naive_scores(model, tokens, mask) -> torch.Tensor:
    """The twelve scores the naive way: ``run_with_cache`` keeps every layer's v, pattern and z, then
    ``scores_of_layer`` per layer."""
    from transformer_lens.utils import get_act_name

    from lens_heads.heads.scores import scores_of_layer
    from lens_heads.models.loading import expand_kv

    L, H = model.cfg.n_layers, model.cfg.n_heads
    wanted = {get_act_name(k, l) for l in range(L) for k in ("v", "pattern", "z")}
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in wanted)
        return torch.stack([scores_of_layer(cache[get_act_name("pattern", l)], expand_kv(cache[get_act_name("v", l)], H),
                                            cache[get_act_name("z", l)], mask) for l in range(L)], dim=1)


def status_kb(field: str) -> int:
    """A field of /proc/self/status in kB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_child(method: str, batch: int, seq: int) -> None:
    """Runs in a fresh process: peak RSS of one call of ``method``; prints one JSON line."""
    from lens_heads import load_model

    model = load_model()
    tokens = make_tokens(model, batch, seq)
    fn = runner(model, tokens, method)
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = status_kb("VmRSS")
    result = fn()
    peak = status_kb("VmHWM")
    del result
    print(json.dumps({"method": method, "rss_before_mb": before / 1024, "peak_mb": peak / 1024}))


def measure_memory(method: str, batch: int, seq: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--memory-child", method, "--batch", str(batch), "--seq", str(seq)],
                         capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"memory run of {method} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_methods(model, tokens, rounds: int) -> dict[str, float]:
    """Median wall seconds of each method over interleaved rounds, after checking scoring against naive."""
    alternate({m: runner(model, tokens[:1, :64], m) for m in METHODS}, 1, keep=())  # first-call allocations
    r = alternate({m: (lambda m=m: runner(model, tokens, m)) for m in METHODS}, rounds, prepared=True,
                  keep=("scoring", "naive"), show=True)
    # The scoring pass must agree with the naive computation for its time to mean anything.
    torch.testing.assert_close(r["scoring"].out, r["naive"].out.float(), atol=1e-4, rtol=1e-4)
    print("  scoring pass == naive cache-then-compute (atol/rtol 1e-4)", flush=True)
    return {m: r[m].wall for m in METHODS}


def summary(times: dict[str, float], memory: dict[str, dict]) -> tuple[str, str]:
    """The table of methods relative to the plain forward, and the verdict against the targets."""
    rows = []
    t0, p0 = times["plain"], memory["plain"]
    for m in METHODS:
        t, mem = times[m], memory[m]
        rows.append(dict(method=m, time_s=t, time_x=t / t0, peak_mb=mem["peak_mb"], peak_x=mem["peak_mb"] / p0["peak_mb"],
                         delta_mb=mem["peak_mb"] - mem["rss_before_mb"]))
    s, n = next(r for r in rows if r["method"] == "scoring"), next(r for r in rows if r["method"] == "naive")
    verdict = (f"scoring vs plain forward: {s['time_x']:.2f}x time (target <= 1.3x), {s['peak_x']:.2f}x peak memory "
               f"(target <= 1.2x); naive cache / scoring peak memory: {n['peak_mb'] / s['peak_mb']:.2f}x "
               f"(target >= 2x); activation memory (delta) naive / scoring: "
               f"{n['delta_mb'] / max(s['delta_mb'], 1):.1f}x")
    return _table(rows), verdict


def main(argv=None) -> None:
    args = parse_settings(ScoresBench, argv, __doc__)
    if args.memory_child:
        return memory_child(args.memory_child, args.batch, args.seq)
    from lens_heads import load_model

    model = load_model()
    tokens = make_tokens(model, args.batch, args.seq)
    started_load = load_average()
    print(f"embedded model, batch {args.batch} x {args.seq} tokens; {machine_line(started_load)}", flush=True)
    times = time_methods(model, tokens, args.rounds)
    del model
    gc.collect()
    memory = {}
    for m in METHODS:
        memory[m] = measure_memory(m, args.batch, args.seq)
        print(f"  memory: {m:12s} peak {memory[m]['peak_mb']:7.0f} MB", flush=True)
    table, verdict = summary(times, memory)
    print()
    print(table)
    print(verdict)
    if args.write_docs:
        _write_docs(args, machine_line(started_load), table, verdict)


def _table(rows) -> str:
    lines = ["| method | time (s) | time / plain | peak RSS (MB) | peak / plain | delta over weights (MB) |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['time_s']:.1f} | {r['time_x']:.2f}x | {r['peak_mb']:.0f} | "
                     f"{r['peak_x']:.2f}x | {r['delta_mb']:.0f} |")
    return "\n".join(lines)


def _write_docs(args, machine: str, table: str, verdict: str) -> None:
    write_section(SECTION, "\n".join([
        f"`python benchmarks/bench_scores.py --batch {args.batch} --seq {args.seq} --rounds {args.rounds}` "
        f"({machine}; fp32 CPU). Embedded SmolLM2-135M-Instruct (30 layers x 9 heads, 3 KV "
        f"heads), a batch of {args.batch} inputs of {args.seq} tokens, no padding. Time: median of {args.rounds} "
        "interleaved round(s) in one process. Memory: peak RSS of a fresh process per method during that method only "
        "(VmHWM reset via /proc/self/clear_refs after loading), weights included; delta = peak minus RSS before.",
        "", table, "", verdict, "",
        "`plain` returns logits (8 x 512 x 49152 floats = 0.8 GB); `plain-trunk` stops before the unembedding, as "
        "the scoring pass does, so the scoring pass's honest overhead is its ratio to `plain-trunk`. `naive` caches "
        "only hook_v/hook_pattern/hook_z (names_filter) and then computes the same scores."]))


if __name__ == "__main__":
    main()
