"""Greedy generation with hooks active, and GSM8K's exact match of the final number.

:func:`generate` extends a prompt one argmax token at a time until a stop string appears in the generated text,
the tokenizer's end-of-sequence token comes, or ``max_new_tokens`` is reached (the text is cut before the stop).

What zeroing means during generation. The authors' patched attention recomputes every head's score at every forward
step. Here, by default (``cache=False``), every step reruns the whole sequence (prompt + tokens generated so far)
with the hooks active: a per-input :func:`lens_heads.ablation.hooks.threshold_zeroing` therefore decides, at each step,
on the scores of the current sequence, and its choice applies to all positions of that step's forward. The
zeroing counts one input row per step, so ``share_zeroed()`` is the share over steps. Every step of one generation
is told the same input id (``input_id``), so a random zeroing draws once per generation. ``cache=True`` keeps
TransformerLens's key-value cache (fast: each step runs only the new token); hooks then see only the new
position, so it takes plain ``(hook_name, fn)`` pairs that act position by position (such as
:func:`lens_heads.ablation.hooks.zero_heads` for a fixed set of heads) and ablations that declare
:attr:`~lens_heads.evaluation.ablation_interface.Ablation.cache_exact` (static, per-input and random zeroing, layer
removal), and refuses a threshold zeroing, which decides from the whole sequence. Many prompts at once:
:func:`lens_heads.evaluation.generate_batch.generate_batch`, which picks the cache itself where it is exact.

GSM8K: :func:`evaluate_generation` generates for each item of ``load_task("gsm8k")`` (the shipped 8-shot
chain-of-thought prompt, stops "\\n\\n" and "Question:") and compares :func:`extract_answer` of the text with the
gold number; for ``load_task("gsm8k_lm_eval")`` (lm-eval's ``gsm8k``) it stops as lm-eval does ("Question:", "</s>",
"<|im_end|>" and the tokenizer's end of sequence) and scores both of lm-eval's filters, ``strict-match`` and
``flexible-extract`` (:mod:`lens_heads.evaluation.lm_eval_filters`). Every result records its cost (wall and CPU
seconds, tokens generated) and, per item, what a per-input zeroing zeroed over its steps. Its continuous companion,
the gold answer's bits-per-byte, comes from ``lens_heads.evaluation.evaluate(model, task).bits_per_byte``.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from lens_heads.data.chat import chat_context, resolve_chat_template
from lens_heads.data.inputs import check_token_ids
from lens_heads.data.rows import DEFAULT_PROTOCOL, check_protocol, encode, lm_eval_bos
from lens_heads.evaluation.ablation_interface import Ablation, describe
from lens_heads.evaluation.eval_settings import EvalSettings, eval_settings
from lens_heads.evaluation.hook_sets import collect_hooks, hook_objects, not_cache_exact, stacked_copies
from lens_heads.evaluation.lm_eval_filters import FILTERS, lm_eval_exact_match
from lens_heads.evaluation.results import wilson_interval
from lens_heads.models.backends import backend
from lens_heads.models.loading import model_meta
from lens_heads.models.nonfinite import where_nonfinite
from lens_heads.plumbing.errors import InputError, NonFiniteError
from lens_heads.plumbing.values import keywords

GSM8K_STOP = ("\n\n", "Question:")
LM_EVAL_GSM8K_STOP = ("Question:", "</s>", "<|im_end|>")  # lm-eval's gsm8k ``until``; the EOS token stops too
TASK_STOPS = {"gsm8k": GSM8K_STOP, "gsm8k_lm_eval": LM_EVAL_GSM8K_STOP}
LM_EVAL_TASKS = ("gsm8k_lm_eval",)  # generations read by lm-eval's filters


@dataclass
class Generation:
    """One greedy generation: the new token ids, their text cut before the stop, and what stopped it."""

    tokens: list[int]
    text: str
    stop: str  # the stop string, "eos", or "max_new_tokens"
    cached: bool = False  # its steps ran only the new token against a key/value cache (else each reran the sequence)


@torch.no_grad()
def generate(model, prompt: str | Sequence[int], *, hooks: Iterable | None = None, max_new_tokens: int = 256,
             stop: Sequence[str] = GSM8K_STOP, cache: bool = False, protocol: str = DEFAULT_PROTOCOL,
             input_id: int = 0) -> Generation:
    """Greedy continuation of ``prompt`` (text, or token ids used as given) with ``hooks`` in every forward.

    A text prompt gets the BOS of ``protocol`` (:mod:`lens_heads.data.rows`: under ``"lm-eval"`` only models that need
    one, such as Gemma, as lm-eval's ``generate_until``; under ``"tl"`` TransformerLens's ``default_prepend_bos``).
    ``cache``: see the module docstring (what zeroing means at each step)."""
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    stop = [stop] if isinstance(stop, str) else list(stop)  # one string is one stop, not one per character
    if stacked_copies(hooks) > 1:
        raise InputError("generate runs one prompt, not a stacked batch of units: pass one unit's HeadAblation")
    pairs, batch_aware = collect_hooks(hooks, model)
    inexact = not_cache_exact(hooks, pairs=False) if cache else []
    if inexact:
        raise InputError(f"cache=True runs only the new token at each step, so {', '.join(inexact)} would decide on "
                         "that one position: use cache=False (reruns the sequence), or an ablation that acts on each "
                         "position alone (static_zeroing, zero_heads(...) pairs for a fixed set of heads)")
    tokens = _prompt_tokens(model, prompt, protocol)
    if len(tokens) + max_new_tokens > model.cfg.n_ctx:
        raise InputError(f"prompt of {len(tokens)} tokens + max_new_tokens={max_new_tokens} exceeds the model's "
                         f"context of {model.cfg.n_ctx}: shorten the prompt (fewer shots) or max_new_tokens")
    eos = model.tokenizer.eos_token_id if model.tokenizer is not None else None
    kv = backend(model).new_kv_cache(model) if cache else None
    new: list[int] = []
    step_input = tokens
    try:
        with model.hooks(fwd_hooks=pairs):
            for _ in range(max_new_tokens):
                with contextlib.ExitStack() as stack:
                    for obj in batch_aware:
                        stack.enter_context(obj.batch(None, first=input_id))
                    ids = torch.tensor([step_input if cache else tokens + new], device=model.cfg.device)
                    next_token, kv = _next_token(model, ids, kv, cache, tokens + new)
                ended = advance(model, new, next_token, eos, stop, max_new_tokens)
                if ended is not None:
                    ended.cached = cache
                    return ended
                step_input = [next_token]
    except NonFiniteError as e:  # diagnosed outside the hooks: where the model's own forward goes non-finite
        raise NonFiniteError(f"{e}; {where_nonfinite(model, tokens + new)}") from None
    raise AssertionError("unreachable: advance() ends a generation at max_new_tokens")


def advance(model, new: list[int], token: int, eos: int | None, stops: Sequence[str],
         max_new_tokens: int) -> Generation | None:
    """Append greedy ``token`` to the tokens ``new`` so far (the end-of-sequence token is not appended); the
    generation if it ends here (by the EOS token, a stop string in the text, which is cut before the first stop, or
    ``max_new_tokens``), else None. Every greedy loop (:func:`generate`,
    :func:`lens_heads.evaluation.generate_batch.generate_batch`, cached or not) ends a generation by this rule."""
    if token == eos:
        return Generation(new, _decode(model, new), "eos")
    new.append(token)
    text = _decode(model, new)
    hits = [(text.index(s), s) for s in stops if s in text]
    if hits:
        at, which = min(hits)
        return Generation(new, text[:at], which)
    return Generation(new, text, "max_new_tokens") if len(new) >= max_new_tokens else None


def greedy_tokens(model, logits: Float[Tensor, "batch d_vocab"], sequences: Sequence[Sequence[int]],
                  input_ids: Sequence[int]) -> list[int]:
    """Each row's argmax of ``logits`` (the logits after ``sequences[row]``, prompt ``input_ids[row]``). Non-finite
    logits are refused, naming the prompt and where the model's forward first goes non-finite: their argmax would be
    a token chosen by a NaN."""
    for k, (sequence, input_id) in enumerate(zip(sequences, input_ids)):
        if not bool(torch.isfinite(logits[k]).all()):
            raise NonFiniteError(f"generation of prompt {input_id} stopped: the logits after {len(sequence)} tokens "
                                 "are NaN or infinite, so no next token can be chosen; "
                                 f"{where_nonfinite(model, list(sequence))}")
    return [int(t) for t in logits.argmax(-1).tolist()]


def _next_token(model, ids: Tensor, kv, cache: bool, sequence: list[int]) -> tuple[int, object]:
    """The greedy next token after ``ids`` (only the new tokens where ``cache``; ``sequence``: all of them), and the
    updated cache. Non-finite logits are refused: their argmax would be a token chosen by a NaN."""
    runs = backend(model)
    if cache:
        logits, kv = runs.cached_logits(model, ids, kv)
    else:
        resid = runs.run_to_resid(model, ids, None, stop=model.cfg.n_layers)
        logits = runs.final_logits(model, resid[:, -1:])[0, -1]
    if not bool(torch.isfinite(logits).all()):
        raise NonFiniteError(f"generation stopped: the logits after {len(sequence)} tokens are NaN or infinite, so no "
                             "next token can be chosen")
    return int(logits.argmax()), kv


def _prompt_tokens(model, prompt: str | Sequence[int], protocol: str) -> list[int]:
    check_protocol(protocol)
    if not isinstance(prompt, str):
        tokens = [int(t) for t in prompt]
    elif not prompt.strip():
        raise InputError(f"the prompt is empty text ({prompt!r}): give text to continue, or token ids ([bos_id]) "
                         "to generate from the BOS alone")
    else:
        bos_id = model.tokenizer.bos_token_id if model.tokenizer is not None else None
        tl_bos = [bos_id] if model.cfg.default_prepend_bos and bos_id is not None else []
        tokens = (lm_eval_bos(model) if protocol == "lm-eval" else tl_bos) + encode(model, prompt)
    if not tokens:
        raise InputError("the prompt is empty: give text or token ids")
    check_token_ids(model, [tokens], ["the prompt"])
    return tokens


def _decode(model, tokens: list[int]) -> str:
    if model.tokenizer is None:
        raise InputError("this model has no tokenizer: generation with stop strings needs one")
    return model.tokenizer.decode(tokens)


# ---------------------------------------------------------------- GSM8K exact match

_FINAL = re.compile(r"answer is\s*(-?\s*\$?\s*-?[\d,]*\.?\d+)")
_NUMBER = re.compile(r"(?<![\d.])-?\$?\d[\d,]*(?:\.\d+)?")  # a minus only when attached: "1200 - 80" ends in 80


def normalize_number(text: str) -> str:
    """Drop thousands commas, "$", spaces and a final "." (the gold answers' "2,125" and "- 10" read 2125, -10)."""
    return re.sub(r"[,$\s]", "", text).rstrip(".")


def extract_answer(text: str) -> str | None:
    """The number after the last "answer is" (the exemplars' "So the answer is N."), else the last number in the
    text, normalised; None when the text has no number."""
    finals = _FINAL.findall(text)
    if finals:
        return normalize_number(finals[-1])
    numbers = _NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


@dataclass
class GenerationRecord:
    """One item's generation: ``answer``/``correct`` by the task's primary reading (lm-eval tasks: strict-match);
    ``filtered``/``matches``: every filter's reading and match (lm-eval tasks); ``zeroed``: [forward steps, (step,
    layer, head) triples zeroed] of a per-input zeroing, None without one."""

    id: str
    target: str
    text: str
    answer: str | None
    correct: bool
    n_new_tokens: int
    stop: str
    filtered: dict[str, str] = field(default_factory=dict)
    matches: dict[str, bool] = field(default_factory=dict)
    zeroed: list[int] | None = None


@dataclass
class GenerationResult:
    """Exact match of generated answers on a task (chance 0), with per-item texts."""

    task: str
    items: list[GenerationRecord]
    meta: dict = field(default_factory=dict)
    chance: float = 0.0

    @property
    def n(self) -> int:
        return len(self.items)

    @property
    def accuracy(self) -> float:
        return float(np.mean([it.correct for it in self.items])) if self.items else float("nan")

    @property
    def ci95(self) -> tuple[float, float]:
        """Wilson score 95% interval of the exact-match accuracy."""
        return wilson_interval(sum(it.correct for it in self.items), self.n)

    @property
    def accuracies(self) -> dict[str, float]:
        """Exact match by each of lm-eval's filters (empty for the chain-of-thought reading)."""
        names = list(self.items[0].matches) if self.items else []
        return {name: float(np.mean([it.matches[name] for it in self.items])) for name in names}

    def share_zeroed(self) -> float:
        """Realised share of heads zeroed over every forward step of every item (NaN without a per-input zeroing):
        triples zeroed / (steps x layers x heads)."""
        zeroed = [it.zeroed for it in self.items if it.zeroed is not None]
        if not self.items or len(zeroed) < len(self.items):
            return float("nan")
        heads = self.meta["model"]["n_layers"] * self.meta["model"]["n_heads"]
        return sum(z[1] for z in zeroed) / (sum(z[0] for z in zeroed) * heads)

    def summary(self) -> dict:
        low, high = self.ci95
        out = dict(task=self.task, n=self.n, exact_match=self.accuracy, ci_low=low, ci_high=high,
                   ci_method="wilson 95%", chance=self.chance)
        for name, accuracy in self.accuracies.items():
            low, high = wilson_interval(sum(it.matches[name] for it in self.items), self.n)
            out[name] = dict(exact_match=accuracy, ci_low=low, ci_high=high)
        return out

    def to_dataframe(self):
        return pd.DataFrame([asdict(it) for it in self.items])

    def __repr__(self) -> str:
        low, high = self.ci95
        return f"GenerationResult({self.task}: exact match {self.accuracy:.3f} [{low:.3f}, {high:.3f}] on n={self.n})"


@keywords(EvalSettings)  # the signature names the settings' fields taken as keywords
def evaluate_generation(model, task, *, hooks: Iterable | None = None, max_new_tokens: int = 256,
                        stop: Sequence[str] | None = None, cache: bool = False, settings: EvalSettings | None = None,
                        progress: bool = True, first_input: int = 0, **options) -> GenerationResult:
    """Greedy-generate for every item of ``task`` (items need a ``target``, as GSM8K's do) and score exact match:
    for ``gsm8k_lm_eval`` by lm-eval's two filters (strict-match primary), else :func:`extract_answer` against the
    normalised target. ``stop``: the task's stops by default (:data:`TASK_STOPS`). Hooks and HeadAblation objects act
    as in :func:`generate`; item ``i`` is input ``first_input + i`` to them (a run split into parts keeps its random
    draws). ``settings`` (:class:`lens_heads.evaluation.eval_settings.EvalSettings`, or its fields as keywords laid
    over it): its ``protocol`` and ``apply_chat_template``, which renders each prompt as lm-eval does
    (:mod:`lens_heads.data.chat`); ``meta["settings"]`` records it whole.
    ``meta`` holds the cost: wall and CPU seconds (this process, all threads) and the tokens generated."""
    evaluation = eval_settings(settings, options)
    protocol, apply_chat_template = evaluation.protocol, evaluation.apply_chat_template
    items = list(task)
    if not items:
        raise InputError("the task has no items")
    if any(it.target is None for it in items):
        raise InputError(f"task {getattr(task, 'name', '?')!r} has no reference answers to match generations "
                         "against: use a generation task such as load_task('gsm8k')")
    name = getattr(task, "name", "task")
    stop = TASK_STOPS.get(name, GSM8K_STOP) if stop is None else stop
    counters = [obj for obj in hook_objects(hooks) if isinstance(obj, Ablation) and obj.counts_inputs]
    chat = resolve_chat_template(model, apply_chat_template)
    start, cpu_start = time.perf_counter(), time.process_time()
    records = []
    for i, item in enumerate(tqdm(items, desc=f"{name} generation", disable=not progress, leave=False)):
        prompt = chat_context(model.tokenizer, item, item.prompt, chat) if chat is not False else item.prompt
        out = generate(model, prompt, hooks=hooks, max_new_tokens=max_new_tokens, stop=stop, cache=cache,
                       protocol=protocol, input_id=first_input + i)
        record = _read_answer(name, item, out)
        if len(counters) == 1:  # [steps, triples zeroed] of this generation's input id
            record.zeroed = list(counters[0].zeroed_by_input().get(first_input + i, (0, 0)))
        records.append(record)
    meta = dict(model=model_meta(model), task=task.meta() if hasattr(task, "meta") else {},
                hooks=[describe(obj) for obj in hook_objects(hooks)],
                decoding="greedy", max_new_tokens=max_new_tokens, stop=list(stop), cache=cache,
                zeroing_recomputed_every_token=bool(counters) and not cache,
                reading="lm-eval gsm8k filters (strict-match, flexible-extract)" if name in LM_EVAL_TASKS else
                "number after the last 'answer is', else the last number",
                protocol=protocol, apply_chat_template=apply_chat_template, chat_template=chat,
                settings=evaluation.to_dict(), wall_s=time.perf_counter() - start,
                cpu_s=time.process_time() - cpu_start, new_tokens=sum(r.n_new_tokens for r in records),
                ci_method="wilson 95%")
    return GenerationResult(task=name, items=records, meta=meta)


def _read_answer(task_name: str, item, out: Generation) -> GenerationRecord:
    """The generation read as the task's evaluation reads it."""
    common = dict(id=item.id, target=item.target, text=out.text, n_new_tokens=len(out.tokens), stop=out.stop)
    if task_name in LM_EVAL_TASKS:
        filtered = {filter_name: read(out.text) for filter_name, read in FILTERS.items()}
        matches = {filter_name: lm_eval_exact_match(value, item.target) for filter_name, value in filtered.items()}
        return GenerationRecord(answer=filtered["strict-match"], correct=matches["strict-match"], filtered=filtered,
                                matches=matches, **common)
    answer = extract_answer(out.text)
    return GenerationRecord(answer=answer, correct=answer == normalize_number(item.target), **common)
