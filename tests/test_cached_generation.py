"""Batched greedy generation against a key/value cache (``lens_heads.evaluation.cached_generation``): on a tiny GPT-2
(learned positions) and a tiny Llama (rotary, grouped-query), prompts of different lengths left-padded into one
batch give, token for token, the texts each prompt gives alone with the whole sequence rerun at every step
(``generate(cache=False)``), unablated, under fixed-head zeroings and under layer removals; the run is counted as the
rerun is. A threshold zeroing, which decides from the whole sequence, takes the rerun path, chosen from what the
ablation declares (``Ablation.cache_exact``)."""

from __future__ import annotations

import pytest

import lens_heads as lh
from conftest import tiny_tokenizer
from lens_heads.ablation.hooks import input_zeroing, zero_heads
from lens_heads.evaluation.cached_generation import uncached_reason
from lens_heads.evaluation.generate import generate
from lens_heads.evaluation.generate_batch import generate_batch
from lens_heads.models import backends

TEXTS = ["Question: what is the capital of France?\nAnswer:", "Once upon a time", "The sun",
         "Two plus two is four, and three plus three is", "Question: which is heavier, a ton of bricks or",
         "A"]
MAX_NEW = [14, 5, 20, 9, 17, 12]  # rows end at different steps: finished rows leave the batch and its cache
ARCHS = ("gpt2", "llama")


@pytest.fixture(scope="module")
def models():
    tokenizer = tiny_tokenizer()
    return {arch: lh.tiny_model(arch, seed=3, d_vocab=len(tokenizer), tokenizer=tokenizer, n_ctx=96, n_layers=3)
            for arch in ARCHS}


def prompts_of(model) -> list[list[int]]:
    return [model.tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


ABLATIONS = {  # name -> hooks for a model (built afresh for each run, so each run's counts are its own)
    "none": lambda m: [],
    "static": lambda m: [lh.static_zeroing(m, [(0, 1), (1, 2), (2, 0)])],
    "static mean": lambda m: [lh.static_zeroing(m, [(1, 3)], ablation="mean",
                                                means=lh.mean_z(m, TEXTS[:3]))],
    "zero_heads pairs": lambda m: zero_heads([(0, 2), (2, 3)]),
    "random per item": lambda m: [lh.random_zeroing(m, 0.3, seed=2)],
    "random per row": lambda m: [lh.random_zeroing(m, 0.3, seed=2, draw="per_row")],
    "per input": lambda m: [input_zeroing(m, [[(i % 3, i % 4)] for i in range(len(TEXTS))])],
    "remove attention": lambda m: [lh.remove_layers(m, [1])],
    "remove block": lambda m: [lh.remove_layers(m, [0, 2], part="block")],
}


def alone(model, hooks, *, stops=None):
    """Each prompt alone, the whole sequence rerun at every step (the reference)."""
    stops = stops or [[] for _ in TEXTS]
    return [generate(model, p, hooks=hooks, max_new_tokens=k, stop=s, input_id=i)
            for i, (p, k, s) in enumerate(zip(prompts_of(model), MAX_NEW, stops))]


def batched(model, hooks, *, stops=None, cache=True, batch_size=4):
    stops = stops or [[] for _ in TEXTS]
    return generate_batch(model, prompts_of(model), hooks=hooks, max_new_tokens=MAX_NEW, stops=stops,
                          batch_size=batch_size, cache=cache)


def same(a, b) -> bool:
    return [(g.tokens, g.text, g.stop) for g in a] == [(g.tokens, g.text, g.stop) for g in b]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_cached_batch_equals_each_prompt_alone_rerun(models, arch, name):
    """Batches of 4 and 2 rows, prompts of 1 to 13 tokens (padding in both), rows ending at different steps."""
    model = models[arch]
    assert uncached_reason(model, ABLATIONS[name](model)) is None
    cached_hooks, alone_hooks = ABLATIONS[name](model), ABLATIONS[name](model)
    made = batched(model, cached_hooks)
    want = alone(model, alone_hooks)
    assert all(g.cached for g in made) and not any(g.cached for g in want)
    assert same(made, want), name
    assert [len(g.tokens) for g in made] == MAX_NEW  # every step compared: no EOS cut a row short here
    for a, b in zip(cached_hooks, alone_hooks):  # per input: the forwards counted and the heads zeroed over them
        if isinstance(a, lh.Ablation):
            assert a.zeroed_by_input() == b.zeroed_by_input()


@pytest.mark.parametrize("arch", ARCHS)
def test_the_ablations_change_the_texts(models, arch):
    """The comparisons above compare something: every ablation but none changes some prompt's tokens."""
    model = models[arch]
    intact = [g.tokens for g in batched(model, [])]
    for name, make in ABLATIONS.items():
        if name != "none":
            assert [g.tokens for g in batched(model, make(model))] != intact, name


@pytest.mark.parametrize("arch", ARCHS)
def test_stop_strings_and_eos_end_rows_as_when_rerun(models, arch):
    """Stops taken from each prompt's own continuation (so they hit mid-way), and EOS made the argmax of a step: the
    rows end where the rerun ends them, with the same cut text."""
    model = models[arch]
    full = alone(model, [])
    stops = [[model.tokenizer.decode(g.tokens[3:5])] if len(g.tokens) > 5 else [] for g in full]
    assert sum(bool(s and s[0].strip()) for s in stops) >= 3
    made, want = batched(model, [], stops=stops), alone(model, [], stops=stops)
    assert same(made, want) and any(g.stop not in ("max_new_tokens", "eos") for g in made)

    eos = model.tokenizer.eos_token_id
    victim = full[0].tokens[6]  # this token is read as the end of sequence: row 0 ends before it, as when rerun
    model.tokenizer.eos_token_id = victim
    try:
        made, want = batched(model, []), alone(model, [])
    finally:
        model.tokenizer.eos_token_id = eos
    assert same(made, want) and made[0].stop == "eos" and len(made[0].tokens) <= 6


@pytest.mark.parametrize("arch", ARCHS)
def test_a_threshold_zeroing_reruns_the_sequence_at_every_step(models, arch):
    """It decides from the whole sequence, which grows at every step: the batch takes the rerun path (its
    declaration, not a probe), and gives what each prompt gives alone, as before the cache existed."""
    model = models[arch]
    scores = lh.score_heads(model, TEXTS, progress=False)
    threshold = lh.thresholds(scores, "AHON (LN)", [0.3])[0.3]
    zeroing = lh.threshold_zeroing(model, "AHON (LN)", threshold)
    assert zeroing.cache_exact is False
    assert "threshold: AHON (LN)" in uncached_reason(model, [zeroing])
    made = batched(model, [zeroing])
    want = alone(model, [lh.threshold_zeroing(model, "AHON (LN)", threshold)])
    assert not any(g.cached for g in made)
    assert same(made, want)
    assert zeroing.zeroed().any()  # the zeroing acted


def test_what_takes_the_cache_is_what_the_hooks_declare(models):
    model = models["gpt2"]

    def unmarked(z, hook=None):  # a pair that says nothing about where it acts: it might read the whole row
        return z

    assert uncached_reason(model, zero_heads([(0, 1)])) is None  # marked for shared prefixes by zero_heads
    assert "hook on blocks.0.attn.hook_z" in uncached_reason(model, [("blocks.0.attn.hook_z", unmarked)])
    made = batched(model, [("blocks.0.attn.hook_z", unmarked)])
    assert not any(g.cached for g in made) and same(made, alone(model, []))
    assert not any(g.cached for g in batched(model, [], cache=False))

    class Declared(lh.Ablation):
        """A new kind of ablation: uncached unless it declares cache_exact."""

        cache_exact = False

        @property
        def hooks(self):
            return zero_heads([(0, 1)])

    assert uncached_reason(model, [Declared()]) is not None
    Declared.cache_exact = True
    assert uncached_reason(model, [Declared()]) is None

    class Other:
        """Not an Ablation: read at the interface's door, uncached unless it says cache_exact = True."""

        hooks = zero_heads([(0, 1)])

    assert uncached_reason(model, [Other()]) is not None
    Other.cache_exact = True
    assert uncached_reason(model, [Other()]) is None


def test_a_model_whose_positions_left_padding_shifts_reruns(models, monkeypatch):
    model = models["llama"]
    monkeypatch.setattr(model.cfg, "use_dynamic_ntk_rope", True)
    assert "left padding changes" in uncached_reason(model, [])
    monkeypatch.setattr(model.cfg, "use_dynamic_ntk_rope", False)
    monkeypatch.setattr(backends.HookedBackend, "caches_batches", False)
    assert "keeps no key/value cache" in uncached_reason(model, [])


def test_generate_with_cache_refuses_only_what_is_not_exact(models):
    model = models["llama"]
    prompt = prompts_of(model)[0]
    static = generate(model, prompt, hooks=[lh.static_zeroing(model, [(0, 1)])], max_new_tokens=6, cache=True)
    assert static.cached and static.tokens == alone(model, [lh.static_zeroing(model, [(0, 1)])])[0].tokens[:6]
    with pytest.raises(ValueError, match=r"cache=True .*threshold: AHON"):
        generate(model, prompt, hooks=[lh.threshold_zeroing(model, "AHON", 0.5)], max_new_tokens=2, cache=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_comparison_sees_a_position_off_by_one(models, arch, monkeypatch):
    """The equality above can fail: each new token placed one position too far (TransformerLens's position ids,
    as its learned positions and its rotary angles read them, plus one on the cached steps) changes the texts."""
    import transformer_lens.components.abstract_attention as attention
    import transformer_lens.components.pos_embed as pos_embed

    model = models[arch]
    want = alone(model, [])
    assert same(batched(model, []), want)
    right = pos_embed.get_offset_position_ids

    def one_too_far(past_kv_pos_offset, attention_mask):
        ids = right(past_kv_pos_offset, attention_mask)
        return ids + 1 if past_kv_pos_offset > 0 and ids.shape[1] == 1 else ids

    for module in (pos_embed, attention):
        monkeypatch.setattr(module, "get_offset_position_ids", one_too_far)
    assert not same(batched(model, []), want)


def test_the_comparison_sees_padding_attended_to(models, monkeypatch):
    """... and so does a mask that lets the queries see the left padding (every position set)."""
    model = models["llama"]
    want = alone(model, [])
    forward = backends.HookedBackend.cached_step

    def padding_attended(self, model, ids, attention_mask, kv):
        return forward(self, model, ids, attention_mask.new_ones(attention_mask.shape), kv)

    monkeypatch.setattr(backends.HookedBackend, "cached_step", padding_attended)
    assert not same(batched(model, []), want)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_evaluator_fast_paths_hand_the_cache_to_transformer_lens(models, arch):
    """Inside the evaluator's fused attention and fast blocks, a layer or block given a key/value cache runs
    TransformerLens's own forward (their eager fallback), so the cached batch is unchanged there."""
    from lens_heads.evaluation.fast_blocks import fast_blocks
    from lens_heads.evaluation.fused_attention import fused_attention

    model = models[arch]
    want = alone(model, ABLATIONS["static"](model))
    with fused_attention(model) as calls, fast_blocks(model):
        made = batched(model, ABLATIONS["static"](model))
    assert all(g.cached for g in made) and same(made, want)
    assert calls.fused == 0 and calls.eager > 0
