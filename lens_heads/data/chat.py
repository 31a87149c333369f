"""Chat templates as lm-evaluation-harness 0.4.5 applies them, and the authors' rule for when to apply one.

``apply_chat_template`` takes four settings; every result records the one given and what it resolved to:

- ``False``: plain text (base models; lm-eval's default).
- ``True``: the tokenizer's template with lm-eval's ``fewshot_as_multiturn``, as the authors ran instruct models
  (``apply_chat_template=True, fewshot_as_multiturn=True``): the task's description is the system turn, each
  few-shot example a user turn (its question) and an assistant turn (its answer), the item's question a last user
  turn, and the generation prompt is added. Where the options sit in the context (WinoGrande: lm-eval's
  multiple-input tasks) the chat holds the description and the examples only, and each option-filled sentence
  follows the rendered chat as raw text, as lm-eval appends it.
- ``"single_turn"``: the template without ``fewshot_as_multiturn`` (lm-eval's ``--apply_chat_template`` alone): the
  examples and the question are one user turn.
- ``"auto"``: ``True`` where the model's name marks a chat model (:data:`CHAT_MODEL_MARKERS`, the substrings the
  authors' ``should_apply_chat_template`` looks for in the Hugging Face name), else ``False``.

The continuation is scored after the assistant prefix the template ends with; :mod:`lens_heads.data.rows` then
moves the prefix's trailing newline into the continuation, as lm-eval's encoding does.
"""

from __future__ import annotations

from lens_heads.plumbing.errors import InputError

CHAT_SETTINGS = (False, True, "single_turn", "auto")
CHAT_MODEL_MARKERS = ("-Instruct", "-chat", "-SFT", "-DPO")


def parse_chat_setting(text: str | bool) -> bool | str:
    """A command line's chat setting: ``off``/``on``/``single_turn``/``auto`` (or a setting already) to
    :data:`CHAT_SETTINGS`."""
    try:
        return check_chat_setting({"off": False, "on": True}.get(text, text) if isinstance(text, str) else text)
    except ValueError:
        raise InputError(f"chat template setting {text!r}: choose off, on, single_turn or auto") from None


def check_chat_setting(apply_chat_template) -> bool | str:
    """``apply_chat_template`` if it is one of :data:`CHAT_SETTINGS`, else a ValueError naming them."""
    if not any(apply_chat_template is s or (isinstance(s, str) and apply_chat_template == s) for s in CHAT_SETTINGS):
        raise InputError(f"apply_chat_template must be False, True (lm-eval's fewshot_as_multiturn, the authors' "
                         f"run), 'single_turn' or 'auto' (on for -Instruct/-chat/-SFT/-DPO models), got "
                         f"{apply_chat_template!r}")
    return apply_chat_template


def model_hub_name(model) -> str:
    """The name the authors' rule reads: the Hugging Face name the model was loaded as (the embedded model's
    upstream name), else its TransformerLens name."""
    meta = getattr(model, "lens_heads_meta", {})
    return str(meta.get("hf_name") or meta.get("name") or model.cfg.model_name)


def resolve_chat_template(model, apply_chat_template) -> bool | str:
    """The rendering ``apply_chat_template`` means for ``model``: ``False``, ``True`` or ``"single_turn"``
    (``"auto"`` decided by the model's name). A template asked for where the tokenizer has none is refused."""
    setting = check_chat_setting(apply_chat_template)
    if setting == "auto":
        setting = any(marker in model_hub_name(model) for marker in CHAT_MODEL_MARKERS)
    if setting is not False and not getattr(model.tokenizer, "chat_template", None):
        raise InputError(f"apply_chat_template={apply_chat_template!r} but the tokenizer of {model_hub_name(model)} "
                         "has no chat template: use apply_chat_template=False (base models), or load the chat "
                         "model's own tokenizer")
    return setting


def chat_messages(item, context: str, multiturn: bool) -> tuple[list[dict], str]:
    """The chat of one of ``item``'s contexts as lm-eval builds it, and the raw text that follows the rendered chat
    ("" except where the options sit in the context).

    ``context`` must be the item's plain rendering: its description, then each few-shot example as
    ``question + " " + answer + "\\n\\n"`` (:attr:`Item.fewshot`), then the question."""
    examples = "".join(f"{question} {answer}\n\n" for question, answer in item.fewshot)
    prefix = item.description + examples
    if not context.startswith(prefix):
        raise InputError(f"item {item.id}: its context does not start with its description and few-shot examples")
    question = context[len(prefix):]
    messages = [{"role": "system", "content": item.description}] if item.description else []
    if multiturn:
        for shot, answer in item.fewshot:
            messages += [{"role": "user", "content": shot}, {"role": "assistant", "content": answer}]
    elif examples:
        messages.append({"role": "user", "content": examples})
    if len(set(item.contexts)) > 1:  # the options are in the context: lm-eval appends it to the rendered chat
        if not messages:
            raise InputError(f"item {item.id}: its options sit in the context and it has no description or few-shot "
                             "examples, so lm-eval's chat would be empty: use shots >= 1 or apply_chat_template=False")
        return messages, question
    if messages and messages[-1]["role"] == "user":  # lm-eval never puts two user turns in a row
        messages[-1]["content"] += question
    else:
        messages.append({"role": "user", "content": question})
    return messages, ""


def chat_context(tokenizer, item, context: str, setting: bool | str) -> str:
    """``context`` rendered through ``tokenizer``'s chat template under a resolved ``setting`` (``True``:
    multi-turn few-shot; ``"single_turn"``), generation prompt added, as lm-eval's ``HFLM.apply_chat_template``."""
    messages, tail = chat_messages(item, context, multiturn=setting is True)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + tail
