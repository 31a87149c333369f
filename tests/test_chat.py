"""Chat templates: rendered as lm-eval 0.4.5 renders them (its own fewshot_context and construct_requests, kept in
tests/data/chat_reference.json by tests/chat_reference.py), "auto" decided by the authors' rule, bad settings refused,
and every result saying which setting it ran."""

import json
from pathlib import Path

import pytest

from conftest import tiny_tokenizer
from lens_heads.data.chat import CHAT_MODEL_MARKERS, check_chat_setting, parse_chat_setting, resolve_chat_template
from lens_heads.data.rows import build_rows, request_pairs
from lens_heads.data.tasks import load_task
from lens_heads.evaluation.evaluate import evaluate

REFERENCE = Path(__file__).resolve().parent / "data" / "chat_reference.json"


@pytest.fixture(scope="module")
def tokenizer():
    # its chat template renders as SmolLM2-135M-Instruct's, which the reference was made with (test_models.py)
    return tiny_tokenizer()


def chat_model(tokenizer, hf_name="HuggingFaceTB/SmolLM2-135M-Instruct"):
    from lens_heads.models.loading import tiny_model

    model = tiny_model("llama", seed=0, n_layers=1, d_vocab=len(tokenizer), tokenizer=tokenizer, n_ctx=2048)
    model.lens_heads_meta["hf_name"] = hf_name
    return model


@pytest.mark.parametrize("multiturn", [True, False])
def test_rendering_is_lm_evals_own(tokenizer, multiturn):
    """MMLU (description as system turn), ARC-Easy with and without examples, HellaSwag and WinoGrande (options in
    the context: the option-filled sentence follows the rendered chat) under fewshot_as_multiturn on and off."""
    reference = json.loads(REFERENCE.read_text())
    model = chat_model(tokenizer)
    setting = True if multiturn else "single_turn"
    for case in reference["cases"]:
        task = load_task(**case["load_task"])
        assert [item.id for item in task] == case["ids"]
        for item, expected in zip(task, case["requests"]):
            assert [list(pair) for pair in request_pairs(model, item, setting)] == expected[str(multiturn)]


def test_multiturn_puts_each_example_in_its_own_turns(tokenizer):
    item = load_task("arc_easy", split="validation", n=1, seed=1, shots=3)[0]
    [(context, continuation)] = request_pairs(chat_model(tokenizer), item, True)[:1]
    assert context.count("<|im_start|>user\n") == 4 and context.count("<|im_start|>assistant\n") == 4
    for question, answer in item.fewshot:
        assert f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>" in context
    assert context.endswith("<|im_start|>assistant\n") and continuation == item.continuations[0]
    rows = build_rows(chat_model(tokenizer), [item], apply_chat_template=True)
    assert tokenizer.decode(rows[0].reads[0][2]).startswith("\n ")  # the template's newline moves to the answer


def test_auto_follows_the_authors_rule_on_the_model_name(tokenizer):
    """The authors' should_apply_chat_template: any of -Instruct, -chat, -SFT, -DPO in the name (case as written)."""
    assert CHAT_MODEL_MARKERS == ("-Instruct", "-chat", "-SFT", "-DPO")
    expected = {"HuggingFaceTB/SmolLM2-135M-Instruct": True, "meta-llama/Llama-2-7b-chat-hf": True,
                "allenai/OLMo-2-1124-7B-SFT": True, "allenai/OLMo-2-1124-7B-DPO": True, "Qwen/Qwen2.5-7B": False,
                "meta-llama/Llama-3.1-8B": False, "some-org/model-instruct": False}
    for name, on in expected.items():
        assert resolve_chat_template(chat_model(tokenizer, name), "auto") is on, name
    item = load_task("arc_easy", n=1)[0]
    base = chat_model(tokenizer, "Qwen/Qwen2.5-7B")
    assert request_pairs(base, item, "auto") == list(zip(item.contexts, item.continuations))
    assert request_pairs(chat_model(tokenizer), item, "auto") == request_pairs(chat_model(tokenizer), item, True)


def test_every_result_says_which_setting_it_ran(tokenizer):
    task = load_task("arc_easy", split="validation", n=2, seed=0)
    result = evaluate(chat_model(tokenizer), task, apply_chat_template="auto", progress=False)
    assert result.meta["apply_chat_template"] == "auto" and result.meta["chat_template"] is True
    assert result.meta["task"]["split"] == "validation"
    plain = evaluate(chat_model(tokenizer, "Qwen/Qwen2.5-7B"), task, apply_chat_template="auto", progress=False)
    assert plain.meta["chat_template"] is False and plain.meta["task"]["split"] == "validation"


def test_bad_chat_settings_are_refused_saying_what_to_do(tokenizer):
    model = chat_model(tokenizer)
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="apply_chat_template must be False, True"):
            check_chat_setting(bad)
        with pytest.raises(ValueError, match="choose off, on, single_turn or auto"):
            parse_chat_setting(bad)
    assert [parse_chat_setting(t) for t in ("off", "on", "single_turn", "auto")] == [False, True, "single_turn",
                                                                                      "auto"]
    base = chat_model(tokenizer, "acme/base-model-Instruct")
    base.tokenizer = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    base.tokenizer.chat_template = None  # a tokenizer without a template, under a name that asks for one
    task = load_task("arc_easy", n=1)
    for setting in (True, "single_turn", "auto"):
        with pytest.raises(ValueError, match=f"apply_chat_template={setting!r} but the tokenizer .* no chat template"):
            evaluate(base, task, apply_chat_template=setting, progress=False)
    wino = load_task("winogrande", n=1, shots=0)  # options in the context and nothing else: lm-eval's chat is empty
    with pytest.raises(ValueError, match="shots >= 1 or apply_chat_template=False"):
        build_rows(model, wino, apply_chat_template=True)
