"""lm-evaluation-harness 0.4.5's own chat rendering of a few items, the reference ``test_chat.py`` checks
lens_heads' rendering against (lm-eval is not a dependency, so the reference is kept in ``tests/data``).

For each case the items come from ``lens_heads.load_task``; lm-eval renders the same documents with the same
few-shot examples (found among its own documents by their rendered text) through its ``fewshot_context`` with
``apply_chat_template=True`` and ``fewshot_as_multiturn`` on or off, and its ``construct_requests`` gives the
(context, continuation) pairs. The chat template is the embedded SmolLM2-135M-Instruct tokenizer's, applied as
``HFLM.apply_chat_template`` does. Write it again with::

    PYTHONPATH=.:<lm-eval site> .venv/bin/python tests/chat_reference.py
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "tests" / "data" / "chat_reference.json"
# (lm-eval task, lens_heads load_task arguments); lm-eval reads the same shipped split
CASES = [
    ("mmlu", dict(name="mmlu", n=2, seed=3, shots=2)),
    ("arc_easy", dict(name="arc_easy", split="validation", n=2, seed=1, shots=2)),
    ("arc_easy", dict(name="arc_easy", split="validation", n=1, seed=2)),
    ("hellaswag", dict(name="hellaswag", n=1, seed=4, shots=1)),
    ("winogrande", dict(name="winogrande", n=2, seed=5, shots=2, fewshot_split="validation")),
]


def _agreement():
    spec = importlib.util.spec_from_file_location("lm_eval_agreement", ROOT / "analyses" / "lm_eval_agreement.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def shot_key(task, doc) -> tuple[str, str]:
    """A document as lm-eval's multi-turn few-shot puts it: (user turn, assistant turn)."""
    text, target = task.doc_to_text(doc), task.doc_to_target(doc)
    text = task.doc_to_choice(doc)[text] if isinstance(text, int) else text
    return text, str(task.doc_to_choice(doc)[target]) if isinstance(target, int) else str(target)


def doc_key(task, doc) -> tuple:
    """A document by its question (None where the options sit in the context) and its choices."""
    text = task.doc_to_text(doc)
    return (text if isinstance(text, str) else None), tuple(task.doc_to_choice(doc))


def item_key(item) -> tuple:
    examples = item.description + "".join(f"{q} {a}\n\n" for q, a in item.fewshot)
    questions = [c[len(examples):] for c in item.contexts]
    if len(set(item.contexts)) > 1:
        return None, tuple(questions)
    return questions[0], tuple(c[1:] for c in item.continuations)


def main() -> None:
    from transformers import AutoTokenizer

    from lens_heads import load_task
    from lens_heads.models.embedded import embedded_model_folder

    agreement = _agreement()
    agreement.import_hflm()  # lm-eval importable under transformers 5
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_folder())
    template = lambda chat: tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)  # noqa: E731
    cases, lm_tasks = [], {}
    for lm_eval_name, arguments in CASES:
        task = load_task(**arguments)
        rendered = []
        for item in task:
            key = (lm_eval_name, task.split, item.subject)
            if key not in lm_tasks:
                lm_task = agreement.lm_eval_task(lm_eval_name, task.split, subject=item.subject)
                lm_tasks[key] = (lm_task, {doc_key(lm_task, d): d for d in lm_task.test_docs()},
                                 {shot_key(lm_task, d): d for d in lm_task.fewshot_docs()})
            lm_task, docs, shots = lm_tasks[key]
            doc, examples = docs[item_key(item)], [shots[pair] for pair in item.fewshot]
            rendered.append({str(multiturn): agreement.lm_eval_requests(lm_task, doc, examples, template, multiturn)
                             for multiturn in (True, False)})
        cases.append(dict(load_task=arguments, ids=[item.id for item in task], requests=rendered))
    REFERENCE.write_text(json.dumps(dict(versions=agreement.versions(), tokenizer="HuggingFaceTB/SmolLM2-135M-Instruct",
                                         cases=cases), indent=1))
    print(f"wrote {REFERENCE}")


if __name__ == "__main__":
    main()
