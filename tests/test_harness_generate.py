"""lm-eval's ``generate_until`` through ``LensHeadsLM``: the prompts run as padded batches (against a key/value cache
where the ablation allows one), each text the one lens_heads' one-prompt generation gives for that prompt alone
(under the same hooks, rerun at every step); a prompt too long for its
``max_gen_toks`` keeps its last tokens, as lm-eval's ``hf`` model cuts it, with a warning naming the request."""

from __future__ import annotations

import pytest

import lens_heads as lh
from conftest import text_model
from lens_heads.evaluation.generate import generate
from lens_heads.evaluation.generate_batch import generate_batch

lm_eval = pytest.importorskip("lm_eval", reason="the harness extra: pip install 'lens_heads[harness]'")
from lm_eval.api.instance import Instance  # noqa: E402

from lens_heads.harness import LensHeadsLM  # noqa: E402

PROMPTS = ["Question: what is the capital of France?\nAnswer:", "Once upon a time", "The sun",
           "Two plus two is four, and three plus three is", "Question: which is heavier, a ton of bricks or"]


@pytest.fixture(scope="module")
def model():
    return text_model(n_ctx=256)


@pytest.mark.parametrize("args", [{}, dict(ablation="random:0.3:per_item:2"), dict(heads="0.1;1.2"),
                                  dict(layers="1"), dict(ablation="threshold:AHON (LN):0.3")], ids=str)
def test_batched_texts_equal_one_prompt_at_a_time(model, args):
    """Five prompts of different lengths in batches of 2 (padding in every batch, a last batch of one), against a
    key/value cache where the ablation is exact under one (the call's record says so), else rerun at each step."""
    kwargs = [dict(until=["\n"], max_gen_toks=6 + 2 * i) for i in range(len(PROMPTS))]
    requests = [Instance("generate_until", {}, (p, k), i) for i, (p, k) in enumerate(zip(PROMPTS, kwargs))]
    lm = LensHeadsLM(pretrained=model, progress=False, batch_size=2, **args)
    texts = lm.generate_until(requests)
    prompts = [model.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    ablation = args.get("ablation", "")
    if "heads" in args:
        hooks = [lh.static_zeroing(model, [(0, 1), (1, 2)])]
    elif "layers" in args:
        hooks = [lh.remove_layers(model, [1])]
    elif ablation.startswith("random"):
        hooks = [lh.random_zeroing(model, 0.3, 2)]
    elif ablation.startswith("threshold"):  # calibrated on the prompts generation reads first
        scores = lh.score_heads(model, prompts, progress=False)
        hooks = [lh.threshold_zeroing(model, "AHON (LN)", lh.thresholds(scores, "AHON (LN)", [0.3])[0.3])]
    else:
        hooks = []
    alone = [generate(model, p, hooks=hooks, max_new_tokens=k["max_gen_toks"], stop=k["until"], input_id=i).text
             for i, (p, k) in enumerate(zip(prompts, kwargs))]
    assert texts == alone
    assert any(texts)  # not all empty: the comparison compares something
    assert lm.get_model_info()["lens_heads"]["calls"][-1]["kv_cache"] is not ablation.startswith("threshold")


@pytest.mark.parametrize("cache", [True, False])
def test_generate_batch_equals_generate_on_token_prompts(model, cache):
    prompts = [model.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    hooks = [lh.static_zeroing(model, [(0, 1), (1, 2)])]
    batched = generate_batch(model, prompts, hooks=hooks, max_new_tokens=[10] * 5, stops=[["."]] * 5, batch_size=3,
                             cache=cache)
    alone = [generate(model, p, hooks=hooks, max_new_tokens=10, stop=["."], input_id=i) for i, p in enumerate(prompts)]
    assert [(g.tokens, g.text, g.stop) for g in batched] == [(g.tokens, g.text, g.stop) for g in alone]
    assert all(g.cached is cache for g in batched)


def test_a_prompt_too_long_keeps_its_last_tokens_with_a_warning():
    short = text_model(n_ctx=24)
    long_prompt = " ".join(["the quiet harbour at dawn"] * 8)
    ids = short.tokenizer(long_prompt, add_special_tokens=False)["input_ids"]
    assert len(ids) + 8 > 24  # the case under test
    request = Instance("generate_until", {}, (long_prompt, dict(until=["\n"], max_gen_toks=8)), 0)
    request.task_name, request.doc_id = "my_task", 7
    with pytest.warns(UserWarning, match=r"request 0 \(my_task document 7\).*keeps the prompt's last 16 tokens"):
        (text,) = LensHeadsLM(pretrained=short, progress=False).generate_until([request])
    assert text == generate(short, ids[-16:], max_new_tokens=8, stop=["\n"]).text
