"""Does lens_heads score items as lm-evaluation-harness does? Same model, same items, both harnesses, compared.

    PYTHONPATH=<lm-eval site> python analyses/lm_eval_agreement.py               # the full comparison
    PYTHONPATH=<lm-eval site> python analyses/lm_eval_agreement.py --subjects 5  # MMLU of 5 subjects only
    PYTHONPATH=<lm-eval site> python analyses/lm_eval_agreement.py --apply-chat-template --tasks mmlu \
        --subjects 2 --out figures/lm_eval_agreement_chat.json

The full MMLU part is 114 prompts of 250-2,700 tokens (71k tokens) per harness; with one thread each on a shared
2-core machine lens_heads' half took 12 minutes and lm-eval's 9. ``--side lm_eval`` in a second process
computes lm-eval's half in parallel, and each finished half is cached, so a rerun resumes. ARC-Easy takes minutes.

Items: lens_heads' own renderings, MMLU 5-shot (the first ``--per-subject`` test questions of every subject, in
dataset order) and ARC-Easy (``--n-arc`` items drawn with ``--seed``). lens_heads scores them with
``evaluate(model, task)`` under its default protocol, ``"lm-eval"``, on the embedded model as a
``HookedTransformer`` (raw weights, fp32, CPU). lm-eval 0.4.5's Hugging Face backend (``HFLM``, ``pretrained`` =
the embedded model's local Hugging Face folder, fp32, CPU) scores the same (context, continuation) pairs:
lm-eval's task and dataset loading would download from the Hugging Face hub, so it is bypassed and the pairs go as
``loglikelihood`` ``Instance`` requests straight to ``HFLM.loglikelihood``, which applies lm-eval's own
tokenisation, row layout (``(context + continuation)[:-1]``, no BOS), request grouping and batching. This checks
everything from the prompt string on; the prompt strings themselves are lens_heads' (lm-eval's formats, tested in
lens_heads' task tests). With ``--apply-chat-template`` lm-eval renders each context through ``HFLM.apply_chat_template``
(the item's description as the system turn, the rest of the context as one user turn, as lm-eval's
``fewshot_context`` builds it without multi-turn few-shot), lens_heads through ``apply_chat_template=True``.

Printed per task: how many items' predictions (argmax of the summed log-likelihood, lm-eval's ``acc``) agree, and
the largest absolute difference of a choice's summed log-likelihood. Written to ``--out`` (JSON): the versions,
model, items (ids and both sides' log-likelihoods), n and the agreement. Target: every prediction equal and every
log-likelihood within 1e-3 in fp32.

lm-eval is not a dependency of lens_heads; install it in a separate environment or target folder, e.g.
``python -m pip install --no-deps --target .lm-eval-site lm_eval==0.4.5`` plus the few modules its import needs
(``sacrebleu portalocker tabulate colorama lxml evaluate sqlitedict peft more_itertools aiohttp tenacity multidict
yarl propcache aiohappyeyeballs aiosignal frozenlist``, each ``--no-deps``), then run with ``PYTHONPATH`` set to it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from lens_heads import load_model, load_task
from lens_heads.plumbing.cache import load_keyed, save_keyed
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.plumbing.io import atomic_write_json
from lens_heads.models.loading import DEFAULT_MODEL, EMBEDDED, cache_dir, embedded_model_folder, model_meta
from lens_heads.plumbing.settings import from_args, option

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1e-3
INSTALL_HINT = ("lm-eval is not importable here. It is not a dependency of lens_heads: install it into a separate "
                "target folder and put that on PYTHONPATH, e.g.\n"
                "  python -m pip install --no-deps --target .lm-eval-site lm_eval==0.4.5 sacrebleu portalocker "
                "tabulate colorama lxml evaluate sqlitedict peft more_itertools aiohttp tenacity multidict yarl "
                "propcache aiohappyeyeballs aiosignal frozenlist\n"
                "  PYTHONPATH=.lm-eval-site python analyses/lm_eval_agreement.py\n"
                "(or a separate virtual environment with `pip install lm_eval==0.4.5`).")


def import_hflm():
    """lm-eval's ``HFLM`` class, or exit with how to install lm-eval."""
    try:
        # transformers 5 removed AutoModelForVision2Seq (now AutoModelForImageTextToText), which lm-eval 0.4.5's
        # hf_vlms.py reads when lm_eval.models is imported. The alias is set after transformers.processing_utils
        # is imported because that import replaces the `transformers` module object (and would drop the alias).
        import transformers.processing_utils  # noqa: F401
        import transformers

        if "AutoModelForVision2Seq" not in vars(transformers) and hasattr(transformers, "AutoModelForImageTextToText"):
            transformers.AutoModelForVision2Seq = transformers.AutoModelForImageTextToText
        from lm_eval.models.huggingface import HFLM
    except ImportError as error:
        sys.exit(f"{INSTALL_HINT}\n(import failed: {error})")
    return HFLM


def agreement_items(name: str, *, per_subject: int, n_arc: int, seed: int, subjects: int | None = None):
    """The compared items as a lens_heads Task: MMLU 5-shot, the first ``per_subject`` test questions of each
    subject (dataset order; of the first ``subjects`` subjects alphabetically, or all); ARC-Easy, ``n_arc`` items
    drawn with ``seed``."""
    if name == "arc_easy":
        return load_task("arc_easy", n=n_arc, seed=seed)
    if name != "mmlu":
        raise ValueError(f"unknown task {name!r}: choose mmlu or arc_easy")
    task = load_task("mmlu", shots=5)
    kept = sorted({item.subject for item in task})[:subjects]
    taken: dict[str, int] = {}
    items = []
    for item in task:
        if item.subject in kept and taken.get(item.subject, 0) < per_subject:
            taken[item.subject] = taken.get(item.subject, 0) + 1
            items.append(item)
    return replace(task, items=items, subjects=taken)


def request_pairs(item, render=None) -> list[tuple[str, str]]:
    """One (context, continuation) pair per choice, as lm-eval's ``loglikelihood`` requests carry them; ``render``
    (lm-eval's ``apply_chat_template``) turns the chat messages of a context into its text."""
    pairs = []
    for context, continuation in zip(item.contexts, item.continuations):
        if render is not None:
            description = item.description
            messages = [{"role": "system", "content": description}] if description else []
            messages.append({"role": "user", "content": context[len(description):]})
            context = render(messages)
        pairs.append((context, continuation))
    return pairs


def lm_eval_logprobs(lm, task, apply_chat_template: bool) -> list[list[float]]:
    """Summed log-likelihood of every choice of every item, from ``HFLM.loglikelihood``."""
    from lm_eval.api.instance import Instance

    requests, owners = [], []
    for i, item in enumerate(task):
        for choice, pair in enumerate(request_pairs(item, lm.apply_chat_template if apply_chat_template else None)):
            requests.append(Instance(request_type="loglikelihood", doc={"id": item.id}, arguments=pair, idx=choice))
            owners.append((i, choice))
    results = lm.loglikelihood(requests)
    out = [[float("nan")] * item.n_choices for item in task]
    for (i, choice), (logprob, _) in zip(owners, results):
        out[i][choice] = float(logprob)
    return out


def cached(path: Path, task, compute) -> list[list[float]]:
    """``compute()``'s per-choice log-likelihoods of ``task``'s items, kept at ``path`` under the item ids so that a
    rerun resumes after a finished side."""
    key = {"ids": [item.id for item in task]}
    stored = load_keyed(path, key)
    if stored is not None:
        print(f"reusing {path}")
        return stored
    t = time.perf_counter()
    logprobs = compute()
    print(f"{path.stem}: {time.perf_counter() - t:.0f} s")
    save_keyed(path, key, logprobs)
    return logprobs


def compare(task, ours: list[list[float]], theirs: list[list[float]]) -> dict:
    """Per-item agreement of predictions and the largest log-likelihood difference of one task."""
    records, max_diff, worst = [], 0.0, None
    for item, lens_heads_lp, lm_eval_lp in zip(task, ours, theirs):
        diff = float(np.max(np.abs(np.asarray(lens_heads_lp) - np.asarray(lm_eval_lp))))
        if diff > max_diff:
            max_diff, worst = diff, item.id
        records.append(dict(id=item.id, gold=item.gold, lens_heads=lens_heads_lp, lm_eval=lm_eval_lp,
                            pred_lens_heads=int(np.argmax(lens_heads_lp)), pred_lm_eval=int(np.argmax(lm_eval_lp)),
                            max_abs_diff=diff))
    disagreeing = [r["id"] for r in records if r["pred_lens_heads"] != r["pred_lm_eval"]]
    return dict(task=task.name, shots=task.shots, split=task.split, n=len(records), n_choices=sum(map(len, theirs)),
                predictions_equal=len(records) - len(disagreeing), disagreeing=disagreeing,
                max_abs_logprob_diff=max_diff, worst_item=worst, within_target=max_diff <= TARGET,
                accuracy_lens_heads=float(np.mean([r["pred_lens_heads"] == r["gold"] for r in records])),
                accuracy_lm_eval=float(np.mean([r["pred_lm_eval"] == r["gold"] for r in records])), items=records)


def versions() -> dict:
    out = dict(python=platform.python_version())
    for package in ("lens_heads", "lm_eval", "transformers", "torch", "transformer_lens"):
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = None
    return out


def write_report(path: Path, args, model, results: list[dict]) -> None:
    """The finished tasks so far, with what they are: versions, model, items, n, settings."""
    items = dict(mmlu=f"test, 5-shot, the first {args.per_subject} questions of "
                 + (f"the first {args.subjects} subjects (alphabetical)" if args.subjects else "every subject"),
                 arc_easy=f"validation, n={args.n_arc} drawn with seed={args.seed}")
    report = dict(what="per-item agreement of lens_heads evaluate() with lm-evaluation-harness HFLM.loglikelihood "
                       "on the same (context, continuation) requests",
                  versions=versions(), protocol="lm-eval", apply_chat_template=args.apply_chat_template,
                  dtype="float32", device="cpu", batch_size=args.batch_size,
                  lm_eval_batch_size=args.lm_eval_batch_size, target_max_abs_logprob_diff=TARGET,
                  model=dict(lens_heads=model_meta(model),
                             lm_eval=dict(backend="lm_eval.models.huggingface.HFLM",
                                          pretrained=f"{EMBEDDED[DEFAULT_MODEL]['hf_name']} (the same local folder)")),
                  items={name: sample for name, sample in items.items() if name in args.tasks},
                  n={r["task"]: r["n"] for r in results}, tasks=results)
    atomic_write_json(path, report)
    print(f"wrote {path}")


AGREEMENT_TASKS = ("arc_easy", "mmlu")


def _agreement_tasks(text: str) -> tuple[str, ...]:
    names = tuple(t.strip() for t in text.replace(" ", ",").split(",") if t.strip())
    for name in names:
        if name not in AGREEMENT_TASKS:
            raise ValueError(f"unknown task {name!r}: choose from {', '.join(AGREEMENT_TASKS)}")
    return names


@dataclass(frozen=True)
class AgreementSettings:
    """The compared items, both harnesses' batch sizes, and where the comparison and its cache go."""

    tasks: tuple[str, ...] = option(AGREEMENT_TASKS, "comma-separated tasks compared", parse=_agreement_tasks)
    per_subject: int = option(2, "MMLU test questions per subject (first in order)")
    subjects: int | None = option(None, "only the first N MMLU subjects (alphabetical; a quick variant): default all "
                                  "57", parse=int)
    n_arc: int = option(100, "ARC-Easy items")
    seed: int = option(0, "seed of the ARC-Easy sample")
    batch_size: int = option(8, "rows per forward of lens_heads")
    lm_eval_batch_size: int = option(1, "HFLM's batch size (its default; HFLM holds [batch, pos, vocab] logits and "
                                     "log-probs: ~8 GB at 8 rows of 2.7k tokens)")
    apply_chat_template: bool = option(False, "render contexts with the chat template")
    out: Path = option(ROOT / "figures" / "lm_eval_agreement.json", "the report (JSON)", parse=Path)
    cache: Path = option(help="each finished side of each task is kept here; a rerun with the same settings reuses it",
                         parse=Path, default_factory=lambda: cache_dir() / "lm_eval_agreement")
    side: str = option("both", "compute only one harness's log-likelihoods into --cache (two processes can run the "
                       "sides in parallel); a later run with both reuses them and writes the report",
                       choices=("both", "lens_heads", "lm_eval"))


def main(argv=None) -> None:
    args = from_args(AgreementSettings, argv, description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    HFLM = import_hflm()

    torch.manual_seed(0)
    model = load_model(DEFAULT_MODEL, device="cpu", dtype="float32") if args.side != "lm_eval" else None
    lm = HFLM(pretrained=str(embedded_model_folder(DEFAULT_MODEL)), device="cpu", dtype="float32",
              batch_size=args.lm_eval_batch_size) if args.side != "lens_heads" else None
    results = []
    for name in args.tasks:
        task = agreement_items(name, per_subject=args.per_subject, n_arc=args.n_arc, seed=args.seed,
                               subjects=args.subjects)
        run = f"{name}-n{len(task)}-{'chat' if args.apply_chat_template else 'plain'}"
        if args.side != "lm_eval":
            ours = cached(args.cache / f"{run}-lens_heads.json", task, lambda: [record.logprobs for record in evaluate(
                model, task, batch_size=args.batch_size, apply_chat_template=args.apply_chat_template).items])
        if args.side != "lens_heads":
            theirs = cached(args.cache / f"{run}-lm_eval.json", task,
                            lambda: lm_eval_logprobs(lm, task, args.apply_chat_template))
        if args.side != "both":
            continue
        result = compare(task, ours, theirs)
        results.append(result)
        print(f"[{name}] {result['n']} items ({result['n_choices']} choices, {task.shots}-shot"
              f"{', chat template' if args.apply_chat_template else ''}): predictions equal on "
              f"{result['predictions_equal']}/{result['n']}; largest |log-likelihood difference| "
              f"{result['max_abs_logprob_diff']:.2e} ({result['worst_item']}; target {TARGET:g}); accuracy "
              f"lens_heads {result['accuracy_lens_heads']:.3f}, lm-eval {result['accuracy_lm_eval']:.3f}")
        write_report(args.out, args, model, results)


if __name__ == "__main__":
    main()
