"""lens_heads as an lm-evaluation-harness model: ``lm_eval --model lens_heads --model_args ...``.

:class:`LensHeadsLM` answers lm-eval's three request types with lens_heads' own machinery:

- ``loglikelihood``: the requests of one document (lm-eval's ``doc_id``; otherwise consecutive requests with the
  same context) become one :class:`~lens_heads.data.items.Item`, and all of them one :func:`lens_heads.evaluate`
  call under the ablation's hooks: lm-eval's rows (the ``"lm-eval"`` protocol), one forward per shared context and
  shared prefixes (a subject's five shots) computed once wherever the hooks allow it.
- ``loglikelihood_rolling``: each text after lm-eval's prefix token, in lm-eval's own rolling windows where it is
  longer than the context, every window under the hooks.
- ``generate_until``: greedy generation of the prompts as one padded batch with a key/value cache, the hooks
  active at every step; a prompt too long for its ``max_gen_toks`` keeps its last tokens, as lm-eval's ``hf`` does.

The ablation (:mod:`lens_heads.harness.model_args`) shows in lm-eval's output: the results' ``config`` holds
``lens_heads`` (the spec, what it was calibrated to, the share of heads zeroed per call and in total), and each logged
sample's ``arguments`` end with ``{"lens_heads": {"share_zeroed": ..., "ablation": ...}}`` for its request. Bad
input (an unknown form, a share outside [0, 1), a thresholds file for another model, heads or layers the model lacks,
a request longer than the context) is refused before any forward.
"""

from __future__ import annotations

import warnings
from typing import Any

import lm_eval.models  # noqa: F401  (lm-eval's own models first: it adds them only while its registry is empty)
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import simple_parse_args_string

from lens_heads.data.items import Item, Task
from lens_heads.data.rows import encode, lm_eval_bos
from lens_heads.evaluation.batching import AUTO, parse_batch_size
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.evaluation.generate_batch import generate_batch
from lens_heads.evaluation.packed_weights import shared_layouts
from lens_heads.harness.model_args import build_hooks, check_against, parse_ablation
from lens_heads.models.embedded import DEFAULT_MODEL
from lens_heads.models.loading import load_model, model_meta
from lens_heads.plumbing.errors import InputError

LM_EVAL_KEYS = ("max_batch_size", "trust_remote_code")  # what lm-eval's command line may add: not used here


@register_model("lens_heads")
class LensHeadsLM(LM):
    """An lm-eval model running a lens_heads model under an ablation (module docstring).

    ``pretrained``: a TransformerLens name, a local Hugging Face folder, a loaded model, or None for the embedded
    default; ``backend``, ``device``, ``dtype`` as :func:`lens_heads.load_model` takes them (``dtype="auto"``: its
    default); ``batch_size``: a number or ``auto``; the ablation keys: :func:`~lens_heads.harness.model_args.parse_ablation`."""

    def __init__(self, pretrained: Any = None, backend: str | None = None, device: str | None = None,
                 dtype: str | None = None, batch_size: int | str | None = None, ablation: str | None = None,
                 heads: str | int | float | None = None, layers: str | int | None = None,
                 layer_part: str = "attention", thresholds: str | None = None, thresholds_task: str | None = None,
                 progress: bool = True, **lm_eval_extra: Any) -> None:
        super().__init__()
        unknown = sorted(set(lm_eval_extra) - set(LM_EVAL_KEYS))
        if unknown:
            raise InputError(f"lens_heads model_args: unknown key(s) {unknown}; the keys are pretrained, backend, "
                             "device, dtype, batch_size, ablation, heads, layers, layer_part, thresholds, "
                             "thresholds_task")
        self.ablation = parse_ablation(ablation, heads, layers, layer_part, thresholds, thresholds_task)
        self.batch_size = _batch_size(batch_size)
        self.progress = progress
        if pretrained is None or isinstance(pretrained, str):
            self.model = load_model(pretrained or DEFAULT_MODEL, backend=backend, device=device,
                                    dtype=None if dtype == "auto" else dtype)
        else:
            self.model = pretrained
        check_against(self.ablation, self.model)
        self.calls: list[dict] = []  # per request-type call: what was zeroed, the tokens run
        # the evaluator's weight layouts, kept between calls as lm-eval's hf model keeps its weights: a second copy
        # of the products' weights (held during every call anyway), made again wherever a weight changes
        self._layouts: dict = {}

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "LensHeadsLM":
        """lm-eval's constructor from ``model_args``; its command-line flags (``--batch_size``, ``--device``) fill
        only what ``model_args`` leaves out (lm-eval's own would pass both and fail)."""
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "LensHeadsLM":
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # ------------------------------------------------------------ lm-eval's three request types

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """(summed log-likelihood of the continuation, whether it is the greedy one) per request, in order."""
        if not requests:
            return []
        items, where = _items([req.args[:2] for req in requests], [_doc_key(req) for req in requests])
        return self._scored(requests, items, where, "loglikelihood", disable_tqdm)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Summed log-likelihood of each text after lm-eval's prefix token, in lm-eval's rolling windows: a text
        longer than the context is cut into windows of ``n_ctx`` predicted tokens, each conditioned on the token
        before it (``lm_eval.utils.get_rolling_token_windows`` with ``context_len=1``, made disjoint by
        ``make_disjoint_window``, as its ``hf`` model does), every window run under the ablation's hooks."""
        if not requests:
            return []
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        tokenizer = self.model.tokenizer
        prefix = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        items: list[Item] = []
        windows_of: list[list[int]] = []
        for i, req in enumerate(requests):
            text = req.args[0]
            tokens = lm_eval_bos(self.model) + encode(self.model, text)  # lm-eval's tok_encode of the text
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=tokens, prefix_token=prefix, max_seq_len=self.model.cfg.n_ctx, context_len=1)]
            windows_of.append(list(range(len(items), len(items) + len(windows))))
            items += [Item(id=f"rolling/{i}/{w}", contexts=("",), continuations=(text,), gold=0,
                           tokens=((tuple(context), tuple(predicted)),))
                      for w, (context, predicted) in enumerate(windows)]
        if not items:
            raise InputError("loglikelihood_rolling: every text encodes to no tokens")
        scored = self._scored(requests, items, [(k, 0) for k in range(len(items))], "loglikelihood_rolling",
                              disable_tqdm, input_of=windows_of)
        return [sum(scored[k][0] for k in windows) for windows in windows_of]

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy generations, each cut before the first of its ``until`` strings, the prompts run as padded
        batches of ``batch_size`` (:func:`lens_heads.evaluation.generate_batch.generate_batch`: against a key/value
        cache where the ablation is exact under one, else rerunning the sequence at each step; the call's record in
        ``get_model_info()["lens_heads"]["calls"]`` says which, ``kv_cache``). A prompt that
        leaves no room for its ``max_gen_toks`` keeps its last ``n_ctx - max_gen_toks`` tokens, as lm-eval's ``hf``
        model cuts it, with a warning naming the request."""
        if not requests:
            return []
        prompts, max_new, stops = [], [], []
        for i, req in enumerate(requests):
            context, kwargs = req.args[0], dict(req.args[1] if len(req.args) > 1 else {})
            if kwargs.get("do_sample"):
                raise InputError(f"request {i} asks for sampling (do_sample=True): lens_heads generates greedily")
            until = kwargs.get("until") or []
            stops.append([until] if isinstance(until, str) else list(until))
            max_new.append(int(kwargs.get("max_gen_toks", 256)))
            prompts.append(_fitted(lm_eval_bos(self.model) + encode(self.model, context), max_new[-1],
                                   self.model.cfg.n_ctx, _request_name(req, i)))
        hooks, calibrated = build_hooks(self.ablation, self.model, [p for p in prompts], batch_size=self.batch_size)
        batch = self.batch_size if isinstance(self.batch_size, int) else 8  # "auto" sizes a scoring pass, not this
        generations = generate_batch(self.model, prompts, hooks=[hooks] if hooks is not None else (),
                                     max_new_tokens=max_new, stops=stops, batch_size=batch,
                                     progress=self.progress and not disable_tqdm)
        self._record(requests, hooks, len(prompts), [[i] for i in range(len(prompts))], calibrated, "generate_until")
        self.calls[-1]["kv_cache"] = all(g.cached for g in generations)  # which path ran (generate_batch's docstring)
        return [g.text for g in generations]

    # ------------------------------------------------------------ what lm-eval records

    def get_model_info(self) -> dict:
        """Merged into lm-eval's results ``config``: the ablation and the share of heads it zeroed."""
        rows = sum(call["rows_counted"] for call in self.calls)
        total = (sum(call["share_zeroed"] * call["rows_counted"] for call in self.calls) / rows) if rows else 0.0
        meta = model_meta(self.model)
        return {"lens_heads": dict(ablation=self.ablation.spec, ablation_args=self.ablation.to_dict(),
                                   share_zeroed=total, calls=self.calls,
                                   model={k: meta[k] for k in ("name", "backend", "weight_basis") if k in meta})}

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.model.tokenizer, "name_or_path", "")).replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return getattr(self.model.tokenizer, "chat_template", None) if chat_template else None

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """lm-eval's ``--apply_chat_template``: the messages through the tokenizer's template, as its ``hf`` model
        renders them (its special tokens are then read as such when the rows are encoded)."""
        return self.model.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                        add_generation_prompt=add_generation_prompt,
                                                        continue_final_message=not add_generation_prompt)

    # ------------------------------------------------------------ the shared path

    def _scored(self, requests, items: list[Item], where: list[tuple[int, int]], kind: str, disable_tqdm: bool,
                input_of: list[list[int]] | None = None) -> list[tuple[float, bool]]:
        task = Task(name=f"lm_eval {kind}", split="requests", shots=0, format="cloze", items=items,
                    n_total=len(items), seed=0, source="lm-eval requests")
        with shared_layouts(self._layouts):  # laid out in the first call, reused by every later one
            hooks, calibrated = build_hooks(self.ablation, self.model, task, batch_size=self.batch_size)
            result = evaluate(self.model, task, hooks=[hooks] if hooks is not None else (),
                              batch_size=self.batch_size, progress=self.progress and not disable_tqdm)
        self._record(requests, hooks, len(items), input_of or [[i] for i, _ in where], calibrated, kind)
        # the tokens of every row, and how many the forwards ran (shared prefixes once) and padded
        self.calls[-1].update({k: result.meta[k] for k in ("row_tokens", "forward_tokens", "padded_tokens")})
        return [(float(result.items[i].logprobs[c]), bool(result.items[i].greedy[c])) for i, c in where]

    def _record(self, requests, hooks, n_inputs: int, input_of: list[list[int]], calibrated: dict, kind: str) -> None:
        """Each request's share of heads zeroed (on its inputs: a rolling text's windows, weighted by their rows
        counted), appended to its arguments; the call's in ``calls``."""
        shares, rows = _shares(hooks, n_inputs)
        for req, inputs in zip(requests, input_of):
            req.arguments = (*req.args, {"lens_heads": dict(share_zeroed=_weighted(shares, rows, inputs),
                                                            ablation=self.ablation.spec)})
        counted = sum(r for s, r in zip(shares, rows) if s is not None)
        share = sum(s * r for s, r in zip(shares, rows) if s is not None) / counted if counted else 0.0
        self.calls.append(dict(request_type=kind, requests=len(requests), inputs=n_inputs, rows_counted=counted,
                               share_zeroed=share, **calibrated))


def _items(pairs: list[tuple[str, str]], keys: list) -> tuple[list[Item], list[tuple[int, int]]]:
    """Consecutive requests of one document (same key; without keys, the same context) as one Item; per request its
    (item, choice)."""
    items: list[Item] = []
    where: list[tuple[int, int]] = []
    group: list[tuple[str, str]] = []
    group_key: tuple = ()

    def close():
        if group:
            name = f"{group_key[0]}/{group_key[1]}" if group_key[0] != "context" else f"request/{len(items)}"
            items.append(Item(id=name, contexts=tuple(c for c, _ in group), continuations=tuple(x for _, x in group),
                              gold=0))

    for (context, continuation), key in zip(pairs, keys):
        key = key if key is not None else ("context", context)
        if key != group_key or not group:
            close()
            group, group_key = [], key
        where.append((len(items), len(group)))
        group.append((context, continuation))
    close()
    return items, where


def _fitted(tokens: list[int], max_new: int, n_ctx: int, name: str) -> list[int]:
    """``tokens`` cut to their last ``n_ctx - max_new`` where they leave no room for ``max_new`` (lm-eval's ``hf``
    model's ``left_truncate_len``), with a warning naming the request; refused where ``max_new`` alone fills the
    context."""
    room = n_ctx - max_new
    if room < 1:
        raise InputError(f"generation {name}: max_gen_toks={max_new} leaves no room for a prompt in the model's context "
                         f"of {n_ctx} tokens: give a smaller max_gen_toks (gen_kwargs)")
    if len(tokens) <= room:
        return tokens
    warnings.warn(f"generation {name}: its prompt of {len(tokens)} tokens + max_gen_toks={max_new} exceeds the "
                  f"model's context of {n_ctx}, so it keeps the prompt's last {room} tokens (as lm-eval's hf model "
                  "does)", stacklevel=3)
    return tokens[-room:]


def _request_name(req, i: int) -> str:
    """A request as a warning names it: its task and document where lm-eval gives them, else its position."""
    task, doc = getattr(req, "task_name", None), getattr(req, "doc_id", None)
    return f"request {i} ({task} document {doc})" if task is not None and doc is not None else f"request {i}"


def _weighted(shares: list[float | None], rows: list[int], inputs: list[int]) -> float | None:
    """The share zeroed over ``inputs`` (a rolling text's windows), weighted by their rows counted; None where none
    of them has one."""
    counted = [(share, rows[i]) for i in inputs if (share := shares[i]) is not None]
    if not counted:
        return None
    weight = sum(r for _, r in counted)
    return sum(s * r for s, r in counted) / weight if weight else counted[0][0]


def _doc_key(req) -> tuple | None:
    return (req.task_name, req.doc_id) if req.doc_id is not None else None


def _shares(hooks, n_inputs: int) -> tuple[list[float | None], list[int]]:
    """Per input: the share of heads the hooks zeroed on it (zeroed (row, layer, head) / (rows x layers x heads)) and
    the rows counted."""
    if hooks is None:
        return [0.0] * n_inputs, [1] * n_inputs
    if not hooks.counts_inputs:  # removed layers: the same heads for every input
        return [float(hooks.share_zeroed())] * n_inputs, [1] * n_inputs
    counted = hooks.zeroed_by_input()
    size = hooks.n_layers * hooks.n_heads
    # an input none of whose rows was counted (all of it a shared prefix) has no share: None, never a number
    shares = [counted[i][1] / (counted[i][0] * size) if i in counted else None for i in range(n_inputs)]
    return shares, [counted.get(i, (0, 0))[0] for i in range(n_inputs)]


def _batch_size(value) -> int | str:
    if value is None:
        return 8
    text = str(value)
    if text.startswith(f"{AUTO}:"):  # lm-eval's auto:N re-detects N times; one detection here
        return AUTO
    return parse_batch_size(text)
