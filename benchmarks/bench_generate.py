"""Batched greedy generation against a key/value cache, and rerunning the sequence at every step, side by side in one
process on the embedded model.

    nice python benchmarks/bench_generate.py [--n 16 --max-new 32 --batch-size 8 --repeats 2 --threads 1]
    nice python benchmarks/bench_generate.py --threads 1 --write-docs  # docs/records/bench_generate.json

What lm-eval's ``generate_until`` runs through ``LensHeadsLM``
(:func:`lens_heads.evaluation.generate_batch.generate_batch`): ``--n`` ARC-Easy validation questions (sampled by
``--seed``) as zero-shot prompts (lm-eval's encoding of the text), ``--batch-size`` per batch, each generating
``--max-new`` tokens greedily (no stop string, so both ways generate the same number of tokens unless the model
ends a text), ``cache=True`` (left-padded, each step runs only the new tokens against TransformerLens's key/value
cache) and ``cache=False`` (each step reruns every unfinished row's whole sequence), alternated (A B A B ...), for
the unablated model and under a static zeroing of ``--share`` of the heads (drawn by ``--seed``). Per way: wall
and process CPU seconds (medians; on a shared machine the CPU seconds of a one-thread run are what an idle core
takes) and generated tokens per wall and per CPU second; the cached/rerun ratio; whether the two ways give the same
tokens. The record names the CPU (lscpu: model, vector flags; torch's CPU capability) and the commit.
"""

from __future__ import annotations

import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import option
from timing import (
    alternate,
    cpu_description,
    load_average,
    machine_line,
    parse_settings,
    repeats_option,
    set_threads,
    threads_option,
)

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class GenerateBench:
    """What the benchmark measures."""

    n: int = option(16, "ARC-Easy validation questions, the prompts")
    max_new: int = option(32, "tokens generated per prompt")
    batch_size: int = option(8, "prompts per batch (LensHeadsLM's default)")
    share: float = option(0.1, "share of heads of the static zeroing")
    repeats: int = repeats_option(2)
    seed: int = option(0, "seed of the question sample and of the zeroed heads")
    threads: int | None = threads_option()
    write_docs: bool = option(False, "write the record to docs/records/bench_generate.json")


def prompts(model, n: int, seed: int) -> list[list[int]]:
    """``n`` ARC-Easy validation questions as lm-eval's ``generate_until`` encodes a context."""
    from lens_heads import load_task
    from lens_heads.data.rows import encode, lm_eval_bos

    task = load_task("arc_easy", split="validation", n=n, seed=seed)
    return [lm_eval_bos(model) + encode(model, item.prompt) for item in task]


def compare(model, ids: list[list[int]], hooks_of, s: GenerateBench) -> dict:
    """Both ways alternated ``s.repeats`` times (fresh hooks each run): per way its timings and tokens per second,
    the ratios, and whether the two gave the same tokens."""
    from lens_heads.evaluation.generate_batch import generate_batch

    def way(cache: bool):
        def run():
            return generate_batch(model, ids, hooks=hooks_of(), max_new_tokens=[s.max_new] * len(ids),
                                  stops=[[] for _ in ids], batch_size=s.batch_size, cache=cache)
        return run

    timings = alternate({"cached": way(True), "rerun": way(False)}, s.repeats)
    tokens = {name: sum(len(g.tokens) for g in t.out) for name, t in timings.items()}
    ways = {name: dict(wall_s=t.wall, cpu_s=t.cpu, walls=t.walls, cpus=t.cpus, tokens=tokens[name],
                       tokens_per_wall_s=tokens[name] / t.wall, tokens_per_cpu_s=tokens[name] / t.cpu,
                       path="cached" if all(g.cached for g in t.out) else "rerun")
            for name, t in timings.items()}
    same = sum(a.tokens == b.tokens for a, b in zip(timings["cached"].out, timings["rerun"].out))
    return dict(**ways, wall_ratio=timings["rerun"].wall / timings["cached"].wall,
                cpu_ratio=timings["rerun"].cpu / timings["cached"].cpu, texts_equal=same, texts=len(ids))


def main(argv=None) -> None:
    s = parse_settings(GenerateBench, argv, __doc__)
    set_threads(s.threads)
    torch.set_grad_enabled(False)
    from lens_heads import load_model, static_zeroing

    started = load_average()
    model = load_model()
    ids = prompts(model, s.n, s.seed)
    heads = [(layer, head) for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads)]
    chosen = random.Random(s.seed).sample(heads, round(s.share * len(heads)))
    runs = {"unablated": lambda: [], f"static zeroing of {len(chosen)} heads": lambda: [static_zeroing(model, chosen)]}
    results = {}
    for name, hooks_of in runs.items():
        out = compare(model, ids, hooks_of, s)
        results[name] = out
        print(f"{name}: {s.n} prompts of {min(map(len, ids))}-{max(map(len, ids))} tokens, {s.max_new} new tokens "
              f"each, batches of {s.batch_size}")
        for way in ("cached", "rerun"):
            w = out[way]
            print(f"  {way:7s} ({w['path']} path) wall {w['wall_s']:6.1f} s  CPU {w['cpu_s']:6.1f} s  "
                  f"{w['tokens_per_wall_s']:6.1f} tokens/wall s  {w['tokens_per_cpu_s']:6.1f} tokens/CPU s")
        print(f"  cached vs rerun: {out['wall_ratio']:.2f}x wall, {out['cpu_ratio']:.2f}x CPU; tokens equal for "
              f"{out['texts_equal']} of {out['texts']} prompts", flush=True)
    machine = machine_line(started)
    cpu = cpu_description(s.threads)
    print(f"machine: {machine}\ncpu: {cpu}")
    if s.write_docs:
        command = "nice python benchmarks/bench_generate.py " + " ".join(sys.argv[1:] if argv is None else argv)
        write_record(ROOT / "docs" / "records" / "bench_generate.json", dict(
            command=command.strip(), machine=machine, cpu=cpu, load_average=dict(start=started, end=load_average()),
            settings=asdict(s), model=model.cfg.model_name, task="arc_easy", split="validation",
            prompt_tokens=dict(min=min(map(len, ids)), max=max(map(len, ids)), total=sum(map(len, ids))),
            runs=results))
        print("wrote docs/records/bench_generate.json")


if __name__ == "__main__":
    main()
