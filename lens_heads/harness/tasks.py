"""lm-evaluation-harness tasks as lens_heads tasks: ``lh.load_task("lm_eval:<task name or YAML path>")``.

lm-eval builds its requests for every document of the task (its own rendering: description, few-shot examples by
its sampler and seed, target delimiter, Jinja templates); each document becomes one :class:`~lens_heads.data.items.Item`
whose ``contexts``/``continuations`` are its ``loglikelihood`` requests' arguments, in lm-eval's order, so the rows
lens_heads runs are the rows lm-eval's ``hf`` model runs (:mod:`lens_heads.data.rows`, the ``"lm-eval"`` protocol).
Multiple choice: gold as lm-eval's ``process_results`` reads it. A generation task (``generate_until``): one
continuation per item, the reference answer after the task's target delimiter (``target``: the answer itself), for
``lens_heads.evaluation.generate`` or the gold answer's bits per byte. A group (``mmlu``) is every subtask's items,
each item's ``subject`` its subtask. Few-shot examples are drawn with lm-eval's default seed (1234), as
``lm_eval.simple_evaluate`` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lens_heads.data.items import Item, Task, sample
from lens_heads.data.tasks import read_docs_cached
from lens_heads.plumbing.errors import InputError

PREFIX = "lm_eval:"
FEWSHOT_SEED = 1234  # lm_eval.simple_evaluate's fewshot_random_seed default


def lm_eval_task(name: str, *, n: int | None = None, seed: int = 0, shots: int | None = None) -> Task:
    """The lm-eval task ``name`` (a registered task or group name, or the path of a task YAML; the ``lm_eval:``
    prefix optional) as a :class:`Task`. ``shots`` overrides the task's ``num_fewshot``; ``n`` samples items by
    ``seed`` (kept in document order)."""
    name = name[len(PREFIX):] if name.startswith(PREFIX) else name
    leaves = _leaf_tasks(name)
    items: list[Item] = []
    subjects: dict[str, int] = {}
    for task_name, task in leaves:
        if shots is not None:
            task.set_config(key="num_fewshot", value=shots)
        task.set_fewshot_seed(seed=FEWSHOT_SEED)
        task.build_all_requests(rank=0, world_size=1)
        built = document_items(task_name, task)
        items += built
        subjects[task_name] = len(built)
    if not items:
        raise InputError(f"lm-eval task {name!r} built no requests")
    keep = sample(len(items), n, seed)
    kept = [items[i] for i in keep]
    num_fewshot = {task.config.num_fewshot or 0 for _, task in leaves}
    return Task(name=f"{PREFIX}{name}", split=leaves[0][1].config.test_split or "validation",
                shots=max(num_fewshot), format=_format(kept), items=kept, n_total=len(items), seed=seed,
                source=f"lm-eval {_version()} ({name})",
                subjects=subjects if len(leaves) > 1 else {}, fewshot_split=leaves[0][1].config.fewshot_split)


def document_items(task_name: str, task) -> list[Item]:
    """One Item per document of a built lm-eval ``task`` (its ``instances``), in document order."""
    by_doc: dict[int, list] = {}
    for instance in task.instances:
        by_doc.setdefault(instance.doc_id, []).append(instance)
    items = []
    for doc_id in sorted(by_doc):
        instances = sorted(by_doc[doc_id], key=lambda inst: inst.idx)
        doc = instances[0].doc
        kind = instances[0].request_type
        if kind == "loglikelihood":
            pairs = [inst.args for inst in instances]
            gold = _gold(task, doc, len(pairs)) if task.OUTPUT_TYPE == "multiple_choice" else 0
            target = None if len(pairs) > 1 else pairs[0][1]
        elif kind == "generate_until":
            reference = str(task.doc_to_target(doc))
            if task.config.doc_to_choice is not None:  # lm-eval's rule: the target is then an index of the choices
                reference = str(task.doc_to_choice(doc)[int(reference)])
            pairs = [(instances[0].args[0], task.config.target_delimiter + reference)]
            gold, target = 0, reference
        else:
            raise InputError(f"lm-eval task {task_name!r} asks for {kind} requests: lens_heads reads multiple-choice, "
                             "loglikelihood and generate_until tasks")
        items.append(Item(id=f"{task_name}/{doc_id}", contexts=tuple(c for c, _ in pairs),
                          continuations=tuple(x for _, x in pairs), gold=gold, subject=task_name,
                          description=task.config.description or "", target=target))
    return items


def _gold(task, doc, n_choices: int) -> int:
    """The gold choice as lm-eval's multiple-choice ``process_results`` reads it (an index, or a choice's text)."""
    gold = task.doc_to_target(doc)
    if isinstance(gold, str) and not gold.isdigit():
        choices = task.doc_to_choice(doc)
        gold = choices.index(gold) if gold in choices else -1
    if isinstance(gold, list) or not 0 <= int(gold) < n_choices:
        raise InputError(f"lm-eval task {task.config.task!r}: document {doc!r} has gold {gold!r}, not one index among "
                         f"its {n_choices} choices (several golds are not read)")
    return int(gold)


def _leaf_tasks(name: str) -> list[tuple[str, Any]]:
    """(task name, built lm-eval Task) of every task under ``name``, a group's subtasks in lm-eval's order."""
    try:
        from lm_eval.tasks import TaskManager, get_task_dict
    except ImportError:
        raise InputError("lm_eval: tasks need lm-evaluation-harness: pip install 'lens_heads[harness]'") from None
    include, task_name = _include_path(name)
    # a YAML of your own reads only its folder: indexing lm-eval's thousands of built-in YAMLs is slow
    manager = TaskManager(include_path=include, include_defaults=include is None)
    if task_name not in manager.all_tasks:
        raise InputError(f"lm-eval has no task or group {task_name!r}: give a name `lm_eval --tasks list` shows or the "
                         "path of a task YAML")
    return list(_flatten(get_task_dict([task_name], manager)))


def _include_path(name: str) -> tuple[str | None, str]:
    """A YAML path's folder (for lm-eval's TaskManager) and the task it names; a plain name is looked up as is."""
    if not name.endswith((".yaml", ".yml")):
        return None, name
    path = Path(name)
    if not path.is_file():
        raise InputError(f"lm-eval task file {name} does not exist")
    config = read_task_yaml(path)
    if not isinstance(config.get("task"), str):
        raise InputError(f"{name} is not an lm-eval task YAML: it names no `task:`")
    return str(path.resolve().parent), config["task"]


def read_task_yaml(path: Path, _seen: frozenset = frozenset()) -> dict:
    """The task YAML at ``path`` as data, its ``include:`` files under it, read with PyYAML's safe loader (lm-eval
    has no public reader of its task YAMLs; its ``!function`` tags are kept as the names they point at, never
    imported). Malformed YAML, a file that is not a mapping, or an include cycle: an :class:`InputError` naming the
    file and the line."""
    import yaml  # type: ignore[import-untyped]  # PyYAML ships no types

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, tag, node: f"!{tag} {loader.construct_scalar(node)}"
                                 if isinstance(node, yaml.ScalarNode) else None)
    path = path.resolve()
    if path in _seen:
        raise InputError(f"lm-eval task file {path} includes itself (through {', '.join(map(str, _seen))})")
    try:
        config = yaml.load(path.read_text(encoding="utf-8"), Loader=Loader)  # noqa: S506 (a safe loader)
    except yaml.YAMLError as e:
        raise yaml_error(e, path) from None
    if not isinstance(config, dict):
        raise InputError(f"lm-eval task file {path} holds a {type(config).__name__}, not a mapping of task fields")
    include = config.pop("include", None)
    if isinstance(include, str):  # lm-eval's rule: the file's own fields over the included file's
        config = {**read_task_yaml(path.parent / include, _seen | {path}), **config}
    return config


def yaml_error(error, path: Path) -> InputError:
    """An :class:`InputError` for a YAML parse ``error`` in ``path``: the file, the line and column, and what the
    parser found."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    line = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = " ".join(str(x) for x in (getattr(error, "context", None), getattr(error, "problem", None)) if x)
    return InputError(f"lm-eval task file {path}{line}: not valid YAML "
                      f"({problem or error}); fix the file there")


def _flatten(tree: dict):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flatten(value)
        else:
            yield getattr(key, "group_name", key), value


def _format(items: list[Item]) -> str:
    """lens_heads' name of the items' format: greedy (one continuation), partial (contexts differ per choice) or
    cloze (a shared context)."""
    if all(it.n_choices == 1 for it in items):
        return "greedy"
    if any(len(set(it.contexts)) > 1 for it in items):
        return "partial"
    return "cloze"


def _version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def hf_documents(task: str, split: str, *, subject: str | None = None) -> list[dict]:
    """The installed benchmark documents of ``task`` ("arc_easy" or "mmlu") in the fields of the Hugging Face datasets
    lm-eval's own YAMLs read (ARC: ``choices.text/label`` and ``answerKey``; MMLU: ``question, subject, choices,
    answer``), for task YAMLs over local JSONL (``dataset_path: json``); ``subject``: one MMLU subject."""
    docs = read_docs_cached(task, split)
    if task == "arc_easy":
        labels = "ABCDE"
        return [{"id": d["id"], "question": d["question"],
                 "choices": {"text": d["choices"]["text"], "label": list(labels[:len(d["choices"]["text"])])},
                 "answerKey": labels[d["gold"]]} for d in docs]
    if task == "mmlu":
        return [{k: d[k] for k in ("question", "subject", "choices", "answer")} for d in docs
                if subject is None or d["subject"] == subject]
    raise InputError(f"hf_documents reads 'arc_easy' or 'mmlu', got {task!r}")
