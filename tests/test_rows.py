"""Forward rows under the two protocols, checked against lm-eval 0.4.5's encoding written out with the tokenizer."""

import numpy as np
import pytest
import torch

from conftest import tiny_tokenizer
from lens_heads.data.rows import build_rows, context_tokens
from lens_heads.data.tasks import load_task
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.heads.scoring import score_heads


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def text_model(tokenizer, **overrides):
    from lens_heads.models.loading import tiny_model

    return tiny_model("llama", seed=0, n_layers=2, d_vocab=len(tokenizer), tokenizer=tokenizer,
                      default_prepend_bos=True, n_ctx=4096, **overrides)


@pytest.fixture(scope="module")
def model(tokenizer):
    return text_model(tokenizer)


def lm_eval_pair(tokenizer, context, continuation, bos=()):
    """lm-eval 0.4.5 ``_encode_pair``: trailing whitespace moves to the continuation; the continuation's tokens are
    what encoding the whole text adds after the context's tokens."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = list(bos) + tokenizer.encode(context + continuation, add_special_tokens=False)
    ctx = list(bos) + tokenizer.encode(context, add_special_tokens=False)
    return ctx, whole[len(ctx):]


def test_lm_eval_rows_drop_the_last_token_and_add_no_bos(model, tokenizer):
    task = load_task("arc_easy", split="validation", n=3, seed=7)  # four-token-plus answers: a row per choice
    rows = build_rows(model, task)
    expected = [(i, c, x) for i, item in enumerate(task)
                for c, x in (lm_eval_pair(tokenizer, ctx, cont) for ctx, cont in zip(item.contexts, item.continuations))]
    assert len(rows) == len(expected)
    for row, (i, ctx, cont) in zip(rows, expected):
        assert row.item == i and row.tokens == (ctx + cont)[:-1]
        assert row.tokens[0] != tokenizer.bos_token_id
        [(_, first, ids)] = row.reads
        assert first == len(ctx) - 1 and ids == cont


def test_tl_rows_prepend_bos_and_run_the_whole_continuation(model, tokenizer):
    task = load_task("piqa", n=2, seed=7)
    rows = build_rows(model, task, protocol="tl")
    for row, (item, choice) in zip(rows, [(it, k) for it in task for k in range(it.n_choices)]):
        context, continuation = item.contexts[choice], item.continuations[choice]
        ctx = [tokenizer.bos_token_id] + tokenizer.encode(context.rstrip(), add_special_tokens=False)
        cont = tokenizer.encode(context[len(context.rstrip()):] + continuation, add_special_tokens=False)
        assert row.tokens == ctx + cont and row.reads[0][1:] == (len(ctx) - 1, cont)


def test_letter_format_shares_one_row_the_context_alone(model, tokenizer):
    task = load_task("mmlu", n=2, shots=1, seed=3)
    rows = build_rows(model, task)
    assert len(rows) == len(task)
    for row, item in zip(rows, task):
        ctx, cont = lm_eval_pair(tokenizer, item.contexts[0], item.continuations[0])
        assert row.tokens == ctx and [r[0] for r in row.reads] == [0, 1, 2, 3]
        assert [r[2] for r in row.reads] == [lm_eval_pair(tokenizer, item.contexts[0], x)[1]
                                             for x in item.continuations]


def test_gemma_models_get_the_bos_lm_eval_forces(tokenizer):
    gemma = text_model(tokenizer)
    gemma.cfg.original_architecture = "Gemma3ForCausalLM"
    item = load_task("arc_easy", split="validation", n=1, seed=2)[0]
    row = build_rows(gemma, [item])[0]
    ctx, cont = lm_eval_pair(tokenizer, item.contexts[0], item.continuations[0], bos=[tokenizer.bos_token_id])
    assert row.tokens == (ctx + cont)[:-1]


def test_single_turn_chat_template_renders_description_as_system_turn(model, tokenizer):
    item = load_task("mmlu", n=1, shots=2, seed=5)[0]
    assert item.description and item.contexts[0].startswith(item.description)
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": item.description},
         {"role": "user", "content": item.contexts[0][len(item.description):]}],
        tokenize=False, add_generation_prompt=True)
    rows = build_rows(model, [item], apply_chat_template="single_turn")
    assert len(rows) == 4  # each answer is two tokens under the chat template, so each choice has its row, as in lm-eval
    for row, letter in zip(rows, " A B C D".split(" ")[1:]):
        ctx, cont = lm_eval_pair(tokenizer, rendered, " " + letter)
        assert row.tokens == (ctx + cont)[:-1] and row.reads[0][1:] == (len(ctx) - 1, cont)
        assert tokenizer.decode(cont) == "\n " + letter  # lm-eval moves the template's trailing newline here
    assert context_tokens(model, item, apply_chat_template="single_turn") == ctx


def test_scores_of_a_task_read_the_evaluated_rows(model, tokenizer):
    task = load_task("piqa", n=3, seed=1)
    from_task = score_heads(model, task, progress=False)
    rows = [(c + x)[:-1] for item in task
            for c, x in (lm_eval_pair(tokenizer, ctx, cont) for ctx, cont in zip(item.contexts, item.continuations))]
    by_hand = score_heads(model, rows, progress=False)
    torch.testing.assert_close(from_task.values, by_hand.values)
    assert from_task.meta["data"]["row_items"] == [0, 0, 1, 1, 2, 2]
    assert from_task.meta["data"]["protocol"] == "lm-eval"


def test_bad_protocol_and_missing_chat_template_are_explained(model, tokenizer):
    task = load_task("arc_easy", split="validation", n=1)
    with pytest.raises(ValueError, match="unknown protocol"):
        evaluate(model, task, protocol="harness", progress=False)
    base = text_model(tiny_tokenizer())
    base.tokenizer.chat_template = None  # a base model's tokenizer (its own copy)
    with pytest.raises(ValueError, match="no chat template"):
        evaluate(base, task, apply_chat_template=True, progress=False)
    assert np.isfinite(evaluate(base, task, progress=False).items[0].logprobs).all()
