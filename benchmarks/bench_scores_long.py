"""Head scores on long prompts: peak memory and tokens/s of the scoring pass by query chunks, against the pass that
hooks each layer's whole pattern, a naive run_with_cache and the evaluator's forward.

    python benchmarks/bench_scores_long.py [--model embedded --lengths 512,2048,8192 --methods evaluator,scoring
                                            --threads 1 --naive-gb 6] [--write-docs]
    python benchmarks/bench_scores_long.py --model gemma-3-270m --lengths 16384,32768 --methods evaluator,scoring \
                                           --threads 1

Each measured (model, method, length) is merged into docs/records/bench_scores_long.json as it finishes (with its
date, commit and load average), so the lengths can be run in separate invocations (the long one when the machine is
quiet); the table and the docs section cover every recorded row.

Models: ``embedded`` (SmolLM2-135M-Instruct, 30 layers x 9 heads, global attention) and ``gemma-3-270m`` (random
init of the released shape, benchmarks/gemma_shape.py: 18 layers x 4 heads, one key/value head, five of every six
layers attending within a 512-token window, context 32,768). Neither method computes logits (262,144 of them per
position for Gemma 3: 34 GB at 32k tokens): both stop at the last residual stream.

One prompt of each length (random ids, after a BOS where the model has a tokenizer; no padding), fp32 CPU, under
no_grad:
  evaluator      the evaluator's forward: fused attention and packed weights, the blocks to the last residual stream
  scoring        lens_heads.score_heads: attention fused, AWFT/AEQD from one more fused attention per layer, over the
                 keys, with its log-sum-exp (lens_heads.heads.attention_rows.fused_row_statistics)
  chunked        score_heads as on a device without that attention: AWFT/AEQD read query_chunk rows at a time from
                 the queries and keys
  whole-pattern  the scoring pass before query chunks: hook_pattern captured whole in every layer (eager attention),
                 the same scores_of_layer on it
  naive          model.run_with_cache(names_filter=hook_v|hook_pattern|hook_z), then scores_of_layer per layer; left
                 out where its cached patterns alone (layers x heads x length^2 floats) exceed --naive-gb

Each (method, length) runs once, in its own fresh process, one after another: the process loads the model, runs the
method once on 64 tokens (first-call allocations), trims the allocator, resets the kernel's peak-RSS counter
(``echo 5 > /proc/self/clear_refs``, Linux), then times one run and reads ``VmHWM``: the peak resident memory of the
whole process during that run (weights included); "delta" is that peak minus the RSS just before. Wall and CPU
seconds from the same run (one run each: 8,192 tokens take minutes); on a shared machine the CPU seconds of a
one-thread run are what an idle core would take, so tokens/s and the ratios are given by CPU seconds too. Before
them, this process checks on the shortest length (at most AGREEMENT_MAX tokens: the naive run holds every layer's
pattern) that the scoring, chunked, whole-pattern and naive scores agree (atol/rtol 1e-4, float32).
"""

from __future__ import annotations

import ctypes
import gc
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench_scores import naive_scores, status_kb
from lens_heads.plumbing.io import atomic_write_json
from lens_heads.plumbing.provenance import code_commit
from lens_heads.plumbing.settings import option
from timing import (
    load_average,
    machine_line,
    parse_settings,
    set_threads,
    threads_option,
    write_docs_option,
    write_section,
)

METHODS = ("evaluator", "scoring", "chunked", "whole-pattern", "naive")
MODELS = {"embedded": (30, 9), "gemma-3-270m": (18, 4)}  # name: (layers, query heads), for the naive run's patterns
AGREEMENT_MAX = 2048  # the longest prompt the agreement check runs (above gemma-3-270m's window of 512)
ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "records" / "bench_scores_long.json"
SECTION = "Scoring pass on long prompts"


@dataclass(frozen=True)
class LongScoresBench:
    """What the benchmark measures; ``--child`` is what the parent passes to each fresh process."""

    model: str = option("embedded", f"the model: {' or '.join(MODELS)}", parse=str)
    lengths: str = option("512,2048,8192", "prompt lengths in tokens, comma-separated ('': none, only the table "
                          "of the recorded rows)", parse=str)
    methods: str = option(",".join(METHODS), "methods to measure, comma-separated (the others' recorded rows stay)",
                          parse=str)
    threads: int | None = threads_option()
    naive_gb: float = option(6.0, "leave out the naive run where its cached patterns exceed this many GB", parse=float)
    write_docs: bool = write_docs_option(SECTION)
    child: str | None = option(None, "METHOD:LENGTH this process measures", parse=str, hidden=True)


def build_model(name: str):
    """The benchmark's model ``name`` (one of :data:`MODELS`)."""
    if name == "gemma-3-270m":
        from gemma_shape import gemma3_270m

        return gemma3_270m()
    from lens_heads import load_model

    return load_model()


def make_tokens(model, length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(100, model.cfg.d_vocab, (1, length), generator=g)
    if model.tokenizer is not None and model.tokenizer.bos_token_id is not None:
        tokens[:, 0] = model.tokenizer.bos_token_id
    return tokens


def runner(model, tokens, method: str):
    """The function that runs ``method`` once on ``tokens`` (scores [input, layer, head, score], or None)."""
    from lens_heads.evaluation.fused_attention import fused_attention
    from lens_heads.evaluation.packed_weights import packed_weights
    from lens_heads.heads import attention_rows
    from lens_heads.heads.scores import scores_of_layer
    from lens_heads.heads.scoring import score_heads
    from lens_heads.models.backends import run_to_resid
    from lens_heads.models.capture import LayerCapture
    from lens_heads.models.loading import expand_kv

    cfg = model.cfg
    L, H = cfg.n_layers, cfg.n_heads
    mask = torch.ones(tokens.shape, dtype=torch.bool)

    def evaluator():
        with torch.no_grad(), fused_attention(model), packed_weights(model):
            run_to_resid(model, tokens, None, stop=L)

    def scoring():
        return score_heads(model, tokens, batch_size=1, progress=False).values

    def chunked():
        fused = attention_rows.fused_statistics_apply
        attention_rows.fused_statistics_apply = lambda source: False  # the rows by chunks, as off the CPU
        try:
            return scoring()
        finally:
            attention_rows.fused_statistics_apply = fused

    def whole_pattern():
        out = torch.empty(tokens.shape[0], L, H, 12)

        def reduce_layer(layer, z, acts):
            out[:, layer] = scores_of_layer(acts["pattern"], expand_kv(acts["v"], H), z, mask, causal=True)

        capture = LayerCapture(L, reduce_layer, ("v", "pattern"))
        with torch.no_grad(), packed_weights(model), model.hooks(fwd_hooks=capture.hooks):
            run_to_resid(model, tokens, None, stop=L)
        return out

    return {"evaluator": evaluator, "scoring": scoring, "chunked": chunked, "whole-pattern": whole_pattern,
            "naive": lambda: naive_scores(model, tokens, mask)}[method]


def child(name: str, method: str, length: int) -> None:
    """In a fresh process: wall time and peak RSS of one run of ``method`` on model ``name``; prints one JSON line."""
    model = build_model(name)
    runner(model, make_tokens(model, 64), method)()  # first-call allocations, outside the measured run
    fn = runner(model, make_tokens(model, length), method)
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = status_kb("VmRSS")
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = status_kb("VmHWM")
    print(json.dumps({"model": name, "method": method, "length": length, "wall_s": wall, "cpu_s": cpu,
                      "rss_before_mb": before / 1024, "peak_mb": peak / 1024, "threads": torch.get_num_threads()}))


def measure(name: str, method: str, length: int, threads: int | None) -> dict:
    started = load_average()
    command = [sys.executable, __file__, "--model", name, "--child", f"{method}:{length}"]
    if threads:
        command += ["--threads", str(threads)]
    out = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{name}: {method} at {length} tokens failed:\n{out.stderr[-3000:]}")
    code = code_commit()
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "date": time.strftime("%Y-%m-%d"),
            "commit": code["commit"], "dirty": code["dirty"], "load_start": started, "load_end": load_average()}


def recorded() -> list[dict]:
    """The recorded rows, each naming its model (rows from before the model was named are the embedded one's)."""
    rows = json.loads(RECORD.read_text())["rows"] if RECORD.exists() else []
    return [{"model": "embedded", **r} for r in rows]


def key(row: dict) -> tuple[str, str, int]:
    return row["model"], row["method"], row["length"]


def record(row: dict) -> list[dict]:
    """Merge ``row`` into the record (replacing an earlier one of its model, method and length); all rows."""
    rows = [r for r in recorded() if key(r) != key(row)] + [row]
    rows.sort(key=lambda r: (list(MODELS).index(r["model"]), r["length"], METHODS.index(r["method"])))
    atomic_write_json(RECORD, {"benchmark": "benchmarks/bench_scores_long.py", "rows": rows})
    return rows


def check_agreement(name: str, length: int) -> None:
    """The scoring, chunked, whole-pattern and naive scores agree on one prompt, for their times to mean anything."""
    model = build_model(name)
    tokens = make_tokens(model, length)
    scoring = runner(model, tokens, "scoring")()
    for other in ("chunked", "whole-pattern", "naive"):
        torch.testing.assert_close(scoring, runner(model, tokens, other)().float(), atol=1e-4, rtol=1e-4)
    print(f"  {name}, {length} tokens: scoring == chunked == whole-pattern == naive (atol/rtol 1e-4)", flush=True)


def naive_gb(name: str, length: int) -> float:
    """The naive run's cached patterns alone: layers x heads x length^2 float32."""
    layers, heads = MODELS[name]
    return layers * heads * length * length * 4 / 1e9


def main(argv=None) -> None:
    args = parse_settings(LongScoresBench, argv, __doc__)
    set_threads(args.threads)
    if args.model not in MODELS:
        raise SystemExit(f"--model: unknown {args.model}; choose from {', '.join(MODELS)}")
    if args.child:
        method, length = args.child.split(":")
        return child(args.model, method, int(length))
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]  # none: the table of what is recorded
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if unknown := sorted(set(methods) - set(METHODS)):
        raise SystemExit(f"--methods: unknown {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    started_load = load_average()
    print(f"{args.model} model, one prompt of {lengths} tokens; {machine_line(started_load)}", flush=True)
    if lengths:
        check_agreement(args.model, min(min(lengths), AGREEMENT_MAX))
    for length in lengths:
        for method in methods:
            if method == "naive" and naive_gb(args.model, length) > args.naive_gb:
                print(f"  {length:6d} {method:14s} left out: its patterns alone are "
                      f"{naive_gb(args.model, length):.0f} GB", flush=True)
                continue
            r = measure(args.model, method, length, args.threads)
            record(r)
            print(f"  {length:6d} {method:14s} {r['wall_s']:7.1f} s ({r['cpu_s']:7.1f} s CPU)  "
                  f"{length / r['cpu_s']:7.1f} tokens/CPU s  peak {r['peak_mb']:6.0f} MB "
                  f"(delta {r['peak_mb'] - r['rss_before_mb']:6.0f} MB)", flush=True)
    rows = recorded()
    tables = [summary([r for r in rows if r["model"] == name], name, args.naive_gb)
              for name in MODELS if any(r["model"] == name for r in rows)]
    table, verdict = "\n\n".join(t for t, _ in tables), "\n".join(v for _, v in tables)
    print()
    print(table)
    print(verdict)
    if args.write_docs:
        write_docs(args, machine_line(started_load), table, verdict)


def summary(rows: list[dict], name: str, limit_gb: float) -> tuple[str, str]:
    """The table (each method's wall and CPU time, tokens/s, ratio to the evaluator, peak and delta) and the
    verdict, from the recorded rows of model ``name``; methods never measured on it are left out."""
    by = {(r["method"], r["length"]): r for r in rows}
    lengths = sorted({r["length"] for r in rows})
    methods = [m for m in METHODS if any(r["method"] == m for r in rows)]
    lines = [f"| tokens ({name}) | method | wall (s) | CPU (s) | tokens / CPU s | / evaluator | peak RSS (MB) | "
             "delta (MB) | date, commit |", "|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for length in lengths:
        evaluator = by.get(("evaluator", length))
        for method in methods:
            r = by.get((method, length))
            if r is None:
                why = (f"left out: its patterns alone are {naive_gb(name, length):.0f} GB (> {limit_gb:g})"
                       if method == "naive" and naive_gb(name, length) > limit_gb else "not measured")
                lines.append(f"| {length} | {method} | {why} | | | | | | |")
                continue
            ratio = f"{evaluator['cpu_s'] / r['cpu_s']:.2f}x" if evaluator else "-"
            lines.append(f"| {length} | {method} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {length / r['cpu_s']:.1f} | "
                         f"{ratio} | {r['peak_mb']:.0f} | {r['peak_mb'] - r['rss_before_mb']:.0f} | {r['date']}, "
                         f"{(r['commit'] or '?')[:7]}{'+' if r['dirty'] else ''} |")
    both = [n for n in lengths if ("evaluator", n) in by and ("scoring", n) in by]
    ratios = ", ".join(f"{by[('evaluator', n)]['cpu_s'] / by[('scoring', n)]['cpu_s']:.2f}x at {n}" for n in both)
    scored = [n for n in lengths if ("scoring", n) in by]
    delta = {n: by[("scoring", n)]["peak_mb"] - by[("scoring", n)]["rss_before_mb"] for n in scored}
    growth = ", ".join(f"{a}->{b} tokens ({b / a:.0f}x): {delta[b] / max(delta[a], 1):.1f}x"
                       for a, b in zip(scored, scored[1:]))
    whole = ", ".join(f"{by[('whole-pattern', n)]['peak_mb'] / by[('scoring', n)]['peak_mb']:.2f}x at {n}"
                      for n in scored if ("whole-pattern", n) in by)
    verdict = (f"{name}: scoring / evaluator tokens per CPU second: {ratios} tokens (target >= 0.5x at every "
               f"length); growth of the scoring pass's activation memory (delta): {growth}"
               + (f"; whole-pattern / scoring peak RSS: {whole}" if whole else ""))
    return "\n".join(lines), verdict


def write_docs(args, machine: str, table: str, verdict: str) -> None:
    threads = f" --threads {args.threads}" if args.threads else ""
    write_section(SECTION, "\n".join([
        f"`python benchmarks/bench_scores_long.py --model {args.model} --lengths {args.lengths} --methods "
        f"{args.methods}{threads} --naive-gb {args.naive_gb:g}` "
        f"(the last invocation: {machine}; fp32 CPU; each row's date and commit in the table, + = uncommitted "
        "changes). Embedded SmolLM2-135M-Instruct (30 layers x 9 heads, 3 KV heads) and a random-init model of "
        "gemma-3-270m's shape (18 layers x 4 heads, 1 KV head, five of every six layers within a 512-token window), "
        "one prompt per length, no padding. Each (method, length) ran once in its own fresh process, one after "
        "another (rows from docs/records/bench_scores_long.json): wall and CPU seconds of that run (tokens/s and "
        "the ratio to the evaluator by CPU seconds: a one-thread run's CPU seconds are what an idle core takes), "
        "and its peak RSS (VmHWM reset via /proc/self/clear_refs after loading and a "
        "64-token warm-up), weights included; delta = peak minus RSS before. The scoring, chunked, whole-pattern "
        "and naive scores agree to 1e-4 on the shortest prompt (checked in the parent process).",
        "", table, "", verdict, "",
        "`evaluator` is the evaluator's forward (fused attention, packed weights, blocks only); `scoring` is "
        "`score_heads` today (attention fused; AWFT and AEQD from one more fused attention per layer, over the keys, "
        "with its log-sum-exp); `chunked` is `score_heads` as on a device without that attention (the pattern "
        "scores read 256 query rows at a time from the queries and keys: the rows recorded as `chunked` before); "
        "`whole-pattern` is the pass as it was before query chunks (every layer's whole pattern hooked, so "
        "attention runs eagerly); `naive` caches hook_v/hook_pattern/hook_z of every layer, then scores."]))


if __name__ == "__main__":
    main()
