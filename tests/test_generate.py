"""Greedy generation equals a hand-rolled argmax loop over ``model(tokens)``, with and without hooks; GSM8K's
answer extraction on hand-written strings."""

import pytest
import torch

from conftest import tiny_tokenizer
from lens_heads.ablation.hooks import threshold_zeroing, zero_heads
from lens_heads.data.items import Item, Task
from lens_heads.evaluation.generate import evaluate_generation, extract_answer, generate


@pytest.fixture(scope="module")
def tiny_text_model():
    from lens_heads.models.loading import tiny_model

    tokenizer = tiny_tokenizer()
    return tiny_model("llama", seed=1, d_vocab=len(tokenizer), tokenizer=tokenizer)


PROMPT = "Question: what is two plus two?\nAnswer:"


def hand_greedy(model, prompt, steps, make_hooks=lambda: []):
    """Reference: rerun the whole sequence with the hooks at every step, append the argmax of the last logits."""
    tokens = model.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    new = []
    hooks = make_hooks()
    with torch.no_grad():
        for _ in range(steps):
            logits = model.run_with_hooks(torch.tensor([tokens + new]), fwd_hooks=hooks)
            new.append(int(logits[0, -1].argmax()))
    return new


def test_generation_equals_a_hand_rolled_greedy_loop_with_and_without_cache(tiny_text_model):
    model = tiny_text_model
    expected = hand_greedy(model, PROMPT, 12)
    assert model.tokenizer.eos_token_id not in expected
    for cache in (False, True):
        out = generate(model, PROMPT, max_new_tokens=12, stop=(), cache=cache)
        assert out.tokens == expected and out.stop == "max_new_tokens"
        assert out.text == model.tokenizer.decode(expected)
    with pytest.raises(ValueError, match="unknown protocol"):
        generate(model, PROMPT, max_new_tokens=1, protocol="hf")
    heads = [(0, 1), (1, 3)]
    zeroed = hand_greedy(model, PROMPT, 12, lambda: zero_heads(heads))
    assert zeroed != expected  # the zeroing matters on this model
    for cache in (False, True):
        assert generate(model, PROMPT, hooks=zero_heads(heads), max_new_tokens=12, stop=(), cache=cache).tokens == zeroed


def test_per_input_zeroing_decides_on_the_whole_sequence_at_every_step(tiny_text_model):
    model = tiny_text_model
    expected = hand_greedy(model, PROMPT, 8, lambda: threshold_zeroing(model, "AHON (LN)", 1.0).hooks)
    zeroing = threshold_zeroing(model, "AHON (LN)", 1.0)
    out = generate(model, PROMPT, hooks=[zeroing], max_new_tokens=8, stop=())
    assert out.tokens == expected
    assert zeroing.zeroed().shape[0] == 8 and zeroing.zeroed().any()  # one input row per step
    with pytest.raises(ValueError, match="cache=True"):
        generate(model, PROMPT, hooks=[zeroing], max_new_tokens=2, cache=True)


def test_generation_stops_at_the_first_stop_string(tiny_text_model):
    model = tiny_text_model
    new = hand_greedy(model, PROMPT, 12)
    stop = model.tokenizer.decode(new[4:6])
    assert stop.strip()
    texts = [model.tokenizer.decode(new[:k]) for k in range(1, 13)]
    k = next(k for k, text in enumerate(texts, start=1) if stop in text)
    out = generate(model, PROMPT, max_new_tokens=12, stop=("never appears", stop))
    assert out.stop == stop and out.tokens == new[:k] and out.text == texts[k - 1][:texts[k - 1].index(stop)]
    # one string is one stop: its first character appears in the text, the whole string never does
    whole = texts[-1][0] + "\x00"
    one = generate(model, PROMPT, max_new_tokens=12, stop=whole)
    assert one.stop == "max_new_tokens" and one.tokens == new


@pytest.mark.parametrize("text,answer", [
    ("Janet sells 9 eggs. She makes 9 * 2 = $18. So the answer is 18.", "18"),
    ("So the answer is 1,450,000.\n", "1450000"),
    ("It drops 10 degrees. So the answer is - 10.", "-10"),
    ("She pays $3.50 each. So the answer is $17.50.", "17.50"),
    ("The answer is 4. Question: no, the answer is 5", "5"),
    ("He has 5 apples and 3 pears", "3"),
    ("800 cups = 1200 - 80", "80"),
    ("It is -4 degrees, then 2,500.5 m", "2500.5"),
    ("Temperatures fell to -4", "-4"),
    ("I do not know", None),
])
def test_gsm8k_answer_extraction(text, answer):
    assert extract_answer(text) == answer


def test_exact_match_against_targets(tiny_text_model, monkeypatch):
    """Exact match compares the extracted answer with the normalised target ("2,125" reads 2125)."""
    import lens_heads.evaluation.generate as gen

    texts = {"q1": " 2 + 3 = 5. So the answer is 2,125.", "q2": " So the answer is 7.", "q3": " no idea"}
    monkeypatch.setattr(gen, "generate", lambda model, prompt, **kw: gen.Generation([1], texts[prompt], "\n\n"))
    items = [Item(id=i, contexts=(i,), continuations=(" x",), gold=0, target=t)
             for i, t in (("q1", "2125"), ("q2", "8"), ("q3", "1"))]
    task = Task(name="gsm8k", split="test", shots=0, format="greedy", items=items, n_total=3, seed=0)
    result = evaluate_generation(tiny_text_model, task, progress=False)
    assert [it.correct for it in result.items] == [True, False, False] and result.accuracy == pytest.approx(1 / 3)
    assert result.chance == 0.0 and result.to_dataframe().shape[0] == 3
    with pytest.raises(ValueError, match="no reference answers"):
        evaluate_generation(tiny_text_model, Task(name="t", split="s", shots=0, format="cloze", n_total=1, seed=0,
                                                  items=[Item(id="a", contexts=("a",), continuations=(" b",), gold=0)]))


def test_zero_heads_names_a_head_the_model_does_not_have(tiny_text_model):
    from lens_heads.data.tasks import load_task
    from lens_heads.evaluation.evaluate import evaluate

    task = load_task("arc_easy", split="validation", n=1)
    heads = tiny_text_model.cfg.n_heads
    with pytest.raises(ValueError, match=f"layer 0 has {heads} heads"):
        evaluate(tiny_text_model, task, hooks=zero_heads([(0, 99)]), progress=False)
    with pytest.raises(ValueError, match="negative"):
        zero_heads([(0, -1)])


def test_bad_prompts_ranks_and_shares_are_refused(tiny_text_model):
    from lens_heads.ablation.specs import StaticAblation
    from lens_heads.collapse.rank import attention_rank
    from lens_heads.data.tasks import load_task
    from lens_heads.evaluation.evaluate import evaluate
    from lens_heads.experiments.effects import oracle_sweep

    model = tiny_text_model
    with pytest.raises(ValueError, match=r"load it first, lens_heads.load_task\('arc_easy'\)"):
        evaluate(model, "arc_easy")
    from lens_heads.models.loading import load_model

    with pytest.raises(ValueError, match="needs a model name or folder, got None"):
        load_model(None)
    with pytest.raises(ValueError, match="99999"):  # token ids were not checked for generation
        generate(model, [1, 99999], max_new_tokens=2)
    with pytest.raises(ValueError, match="batch_size must be a whole number >= 1, got 0"):
        attention_rank(model, ["a b c"], batch_size=0)
    with pytest.raises(ValueError, match=r"fraction=-0.1.*\[0, 1\)"):
        StaticAblation(score="AHON (LN)", fraction=-0.1)
    order = [(layer, head) for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads)]
    with pytest.raises(ValueError, match=r"fractions must lie in \[0, 1\)"):
        oracle_sweep(model, load_task("arc_easy", split="validation", n=2), order, fractions=(-0.1, 0.2), progress=False)


def test_lm_eval_gsm8k_reads_both_filters_with_lm_evals_stops(tiny_text_model, monkeypatch):
    import lens_heads.evaluation.generate as gen

    gold = "He has 3 + 4 = <<3+4=7>>7.\n#### 7"
    texts = {"q1": " 3 + 4 = 7\n#### 7", "q2": " 3 + 4 = 7 so 7.", "q3": " #### 6 no wait 7"}
    seen = []

    def fake(model, prompt, **kw):
        seen.append(kw["stop"])
        return gen.Generation([1], texts[prompt], "Question:")

    monkeypatch.setattr(gen, "generate", fake)
    items = [Item(id=i, contexts=(i,), continuations=(" " + gold,), gold=0, target=gold) for i in texts]
    task = Task(name="gsm8k_lm_eval", split="test", shots=0, format="greedy", items=items, n_total=3, seed=0)
    result = evaluate_generation(tiny_text_model, task, progress=False)
    assert seen[0] == ("Question:", "</s>", "<|im_end|>")
    assert [it.matches for it in result.items] == [{"strict-match": True, "flexible-extract": True},
                                                   {"strict-match": False, "flexible-extract": True},
                                                   {"strict-match": False, "flexible-extract": True}]
    assert [it.answer for it in result.items] == ["7", "[invalid]", "6"]  # the primary reading: strict-match
    assert result.accuracy == pytest.approx(1 / 3)
    assert result.accuracies == pytest.approx({"strict-match": 1 / 3, "flexible-extract": 1.0})
    assert result.summary()["flexible-extract"]["exact_match"] == 1.0
    assert result.meta["cpu_s"] >= 0 and result.meta["new_tokens"] == 3


def test_a_generations_zeroing_is_counted_per_step_and_item(tiny_text_model):
    model = tiny_text_model
    items = [Item(id=str(i), contexts=(p,), continuations=(" 4",), gold=0, target="4")
             for i, p in enumerate([PROMPT, "Question: and three plus one?\nAnswer:"])]
    task = Task(name="gsm8k_lm_eval", split="test", shots=0, format="greedy", items=items, n_total=2, seed=0)
    zeroing = threshold_zeroing(model, "AHON (LN)", 1.0)
    result = evaluate_generation(model, task, hooks=[zeroing], max_new_tokens=5, stop=(), progress=False)
    decisions = zeroing.zeroed()  # [step, layer, head], the steps of both items in order
    steps = [it.n_new_tokens + (it.stop == "eos") for it in result.items]  # an EOS step appends no token
    assert [it.zeroed[0] for it in result.items] == steps and decisions.shape[0] == sum(steps)
    assert result.items[0].zeroed[1] == int(decisions[:steps[0]].sum())
    assert result.share_zeroed() == pytest.approx(decisions.float().mean().item())
    assert result.meta["zeroing_recomputed_every_token"] and 0 < result.share_zeroed() < 1
