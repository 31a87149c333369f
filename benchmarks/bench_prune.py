"""What an exported pruned model saves: the embedded model with its k lowest-Block-Influence blocks dropped
(``lens_heads.prune``, k = 1, 2, 4), against the original, side by side in one process.

    nice python benchmarks/bench_prune.py [--counts 1,2,4 --arc-n 16 --batch 4 --seq 128 --repeats 3] [--write-docs]

Per k: parameters and weight bytes (tied embeddings once); the KV cache a Hugging Face forward of ``batch x seq``
tokens keeps (``past_key_values``, measured); memory, each model in fresh processes (the median of ``--memory-runs``)
that load the folder with plain transformers and run that forward twice: the resident memory before the second
forward (weights, runtime and libraries: ``RSS MB``) and the second forward's peak above it (``VmHWM`` after a reset
through ``/proc/self/clear_refs``, Linux, after an allocator trim: ``fwd MB``, activations and cache, which moves by
~20 MB from run to run); the throughput of a plain
Hugging Face forward (tokens/s) and of lens_heads' evaluator on ARC-Easy (``evaluate``: the original unhooked, the
original under the hooked removal, the exported folder loaded with ``load_model``; items/s); and the agreement of
the exported model with the hooked removal on the original (the largest per-choice log-likelihood difference in the
evaluator, nats; the largest logit difference of plain transformers on the forward's tokens). Compared runs
alternate (A B A B ...) in one process; medians are reported, and the fastest run (``best``) beside them; the load
average is recorded, since on a shared machine absolute times move with it.

The layers are ranked by Block Influence (``lens_heads.experiments.layer_ranking.block_influence``) on the ARC-Easy rows.
Writes a JSON record (load average, settings, numbers; its provenance: date, commit, versions, machine) to
``--out``.
"""

from __future__ import annotations

import ctypes
import gc
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import option
from timing import (
    alternate,
    load_average,
    machine_line,
    parse_settings,
    repeats_option,
    set_threads,
    threads_option,
    write_docs_option,
    write_printed,
)

ROOT = Path(__file__).resolve().parents[1]
HEADING = "Pruned export"


@dataclass(frozen=True)
class PruneBench:
    """What the benchmark measures."""

    counts: str = option("1,2,4", "numbers of blocks removed, comma-separated")
    arc_n: int = option(16, "ARC-Easy items evaluated (validation split)")
    batch: int = option(4, "inputs per Hugging Face forward")
    seq: int = option(128, "tokens per input of the Hugging Face forward")
    repeats: int = repeats_option(3)
    memory_runs: int = option(3, "fresh processes per model for the memory figures (median reported)")
    threads: int | None = threads_option()
    out: str = option("docs/records/bench_prune.json", "the JSON record written (relative to the repository)")
    write_docs: bool = write_docs_option(HEADING)
    memory_child: str | None = option(None, "the folder whose peak memory this process measures", parse=str,
                                      hidden=True)


def weights(hf) -> tuple[int, int]:
    """Parameters and their bytes, a tensor shared by two names (tied embeddings) counted once."""
    seen: dict[int, torch.Tensor] = {}
    for p in hf.parameters():
        seen.setdefault(p.data_ptr(), p)
    return sum(p.numel() for p in seen.values()), sum(p.numel() * p.element_size() for p in seen.values())


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


@torch.no_grad()
def memory_child(folder: str, batch: int, seq: int) -> None:
    """In a fresh process: load ``folder`` with plain transformers, run one forward of ``batch x seq`` random tokens
    and print the peak resident memory (whole process) and the forward's peak above the memory before it."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokens = torch.randint(100, hf.config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    hf(tokens, use_cache=True)  # weights read lazily from their file are resident after this
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status_kb("VmRSS")
    out = hf(tokens, use_cache=True)
    forward_peak = _status_kb("VmHWM")
    cache = out.past_key_values
    kv = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    print(json.dumps(dict(kv_cache_mb=kv / 2**20, rss_before_forward_mb=before / 1024,
                          forward_peak_delta_mb=(forward_peak - before) / 1024, peak_rss_mb=forward_peak / 1024)))


def measure_memory(folder: Path, s: PruneBench) -> dict:
    """The memory child's numbers for ``folder``, the median of ``--memory-runs`` fresh processes (the forward's
    peak moves by ~20 MB from run to run; the resident memory before it by well under 1 MB)."""
    runs = []
    for _ in range(s.memory_runs):
        run = subprocess.run([sys.executable, __file__, "--memory-child", str(folder), "--batch", str(s.batch),
                              "--seq", str(s.seq)], capture_output=True, text=True, check=False, cwd=ROOT)
        if run.returncode != 0:
            raise RuntimeError(f"memory run of {folder} failed:\n{run.stderr[-3000:]}")
        runs.append(json.loads(run.stdout.strip().splitlines()[-1]))
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]} | dict(
        forward_peak_delta_runs_mb=[r["forward_peak_delta_mb"] for r in runs])


def block_order(model, task) -> list[int]:
    """Every layer, lowest Block Influence first, on the task's forward rows."""
    from lens_heads.data.inputs import tokenize_inputs
    from lens_heads.experiments.layer_ranking import block_influence

    tokens, mask = tokenize_inputs(model, task)  # the rows the evaluation runs
    influence, _ = block_influence(model, tokens, mask, progress=False)
    return sorted(range(len(influence)), key=lambda layer: (float(influence[layer]), layer))


def rates(timings: dict, amount: float) -> dict:
    """Per compared run: ``amount`` per second at the median and at the fastest run."""
    return {name: dict(median=amount / t.wall, best=amount / t.best) for name, t in timings.items()}


def measure_k(model, original, task, tokens, layers: list[int], folder: Path, s: PruneBench) -> dict:
    """Export the model without ``layers`` (whole blocks) into ``folder`` and measure it against the original."""
    from transformers import AutoModelForCausalLM

    from lens_heads import load_model, prune
    from lens_heads.ablation.removed_layers import remove_layers
    from lens_heads.evaluation.evaluate import evaluate

    prune(model, layers=layers, part="block").save(folder)
    exported_hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    exported = load_model(str(folder), device="cpu")
    removal = remove_layers(model, layers, part="block")
    with torch.no_grad():
        logit_diff = (exported_hf(tokens).logits - model.run_with_hooks(tokens, fwd_hooks=removal.hooks)
                      ).abs().max().item()  # plain transformers against the hooked removal, same tokens
        hf_times = alternate({"original": lambda: original(tokens, use_cache=False),
                              "exported": lambda: exported_hf(tokens, use_cache=False)}, s.repeats, keep=())
    kw = dict(progress=False, batch_size=8)
    evals = alternate({"original": lambda: evaluate(model, task, **kw),
                       "hooked": lambda: evaluate(model, task, hooks=removal, **kw),
                       "exported": lambda: evaluate(exported, task, **kw)}, s.repeats)
    hooked, ours = evals["hooked"].out, evals["exported"].out
    diff = max(abs(a - b) for x, y in zip(hooked.items, ours.items) for a, b in zip(x.logprobs, y.logprobs))
    n_params, n_bytes = weights(exported_hf)
    return dict(k=len(layers), layers=layers, params=n_params, weights_mb=n_bytes / 2**20,
                **measure_memory(folder, s), hf_tokens_per_s=rates(hf_times, tokens.numel()),
                eval_items_per_s=rates(evals, len(task)), hf_wall_s={n: t.walls for n, t in hf_times.items()},
                eval_wall_s={n: t.walls for n, t in evals.items()}, max_abs_loglik_diff=diff,
                max_abs_logit_diff_hf=logit_diff, accuracy={n: t.out.accuracy for n, t in evals.items()})


def main(argv=None) -> None:
    s = parse_settings(PruneBench, argv, __doc__)
    set_threads(s.threads)
    if s.memory_child:
        return memory_child(s.memory_child, s.batch, s.seq)
    started_load = load_average()
    from transformers import AutoModelForCausalLM

    from lens_heads import load_model, load_task
    from lens_heads.models.embedded import embedded_model_folder

    counts = [int(k) for k in s.counts.split(",")]
    model = load_model(device="cpu")
    task = load_task("arc_easy", n=s.arc_n, split="validation")
    order = block_order(model, task)
    original = AutoModelForCausalLM.from_pretrained(embedded_model_folder(), dtype=torch.float32).eval()
    tokens = torch.randint(100, model.cfg.d_vocab, (s.batch, s.seq), generator=torch.Generator().manual_seed(0))
    n_params, n_bytes = weights(original)
    base = dict(params=n_params, weights_mb=n_bytes / 2**20, **measure_memory(embedded_model_folder(), s))
    lines = [f"Block Influence order (lowest first): {order[:8]} ...",
             f"{'k':>2} {'model':9} {'params M':>8} {'weights MB':>10} {'KV MB':>6} {'RSS MB':>6} "
             f"{'fwd MB':>6} {'HF tok/s (best)':>15} {'eval items/s (best)':>19} {'max |dLL|':>9} {'|dlogit|':>8}"]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-prune-") as tmp:
        for k in counts:
            row = measure_k(model, original, task, tokens, order[:k], Path(tmp) / f"k{k}", s)
            rows.append(row)
            hf, ev = row["hf_tokens_per_s"], row["eval_items_per_s"]
            for name, m in (("original", base), ("exported", row)):
                agree = f" {row['max_abs_loglik_diff']:9.1e} {row['max_abs_logit_diff_hf']:8.1e}" if m is row else ""
                lines.append(f"{k:>2} {name:9} {m['params'] / 1e6:8.1f} {m['weights_mb']:10.1f} {m['kv_cache_mb']:6.2f} "
                             f"{m['rss_before_forward_mb']:6.0f} {m['forward_peak_delta_mb']:6.0f} "
                             f"{hf[name]['median']:8.0f} ({hf[name]['best']:4.0f}) "
                             f"{ev[name]['median']:11.2f} ({ev[name]['best']:5.2f}){agree}")
            lines.append(f"{k:>2} {'hooked':9} {'':>8} {'':>10} {'':>6} {'':>6} {'':>6} {'':>15} "
                         f"{ev['hooked']['median']:11.2f} ({ev['hooked']['best']:5.2f})")
    machine = machine_line(started_load)
    print("\n".join(lines))
    print(f"machine: {machine}")
    record = dict(machine=machine, load_average=dict(start=started_load, end=load_average()), settings=asdict(s),
                  model=model.lens_heads_meta.get("hf_name"), order=order, original=base, pruned=rows)
    path = write_record(ROOT / s.out, record)
    print(f"wrote {path}")
    if s.write_docs:
        write_printed(HEADING, f"nice python benchmarks/bench_prune.py --counts {s.counts} --arc-n {s.arc_n} "
                      f"--batch {s.batch} --seq {s.seq} --repeats {s.repeats}", machine,
                      f"; medians of {s.repeats} alternated runs; record in {s.out}.", [lines])


if __name__ == "__main__":
    main()
