"""The head explorer: its data against the model run independently, its errors, its escaping, and in headless
Chromium (network cut) clicking a heatmap cell shows that head's pattern, as ``model.run_with_cache`` computes it."""

import json

import numpy as np
import pytest
import torch

import lens_heads as lh
from lens_heads.viz.explorer_view import script_json

MARKUP = "<b>bold</b><script>alert(1)</script><!-- x --> The capital of France is"
PROMPTS = ["When Mary and John went to the store, John gave a drink to", MARKUP]
QUANTUM = 0.5 / 255 + 1e-6


def independent_pattern(model, prompt: str, layer: int, head: int) -> np.ndarray:
    tokens = model.to_tokens(prompt)
    _, cache = model.run_with_cache(tokens)
    return cache["pattern", layer][0, head].float().numpy()


@pytest.fixture(scope="module")
def explorer(smollm):
    return lh.explore(smollm, PROMPTS, score="AWFT")


def test_stored_patterns_are_the_model_s(explorer, smollm):
    for prompt, (layer, head) in [(0, (3, 2)), (1, (20, 7)), (0, (0, 0))]:
        expected = independent_pattern(smollm, PROMPTS[prompt], layer, head)
        assert np.abs(explorer.pattern(prompt, layer, head) - expected).max() <= QUANTUM
    assert explorer.data["prompts"][1]["tokens"] == list(smollm.to_str_tokens(MARKUP))


def test_maps_ranks_and_per_prompt_scores_match_the_library(explorer, smollm):
    scores = lh.score_heads(smollm, PROMPTS, progress=False)
    d = explorer.data
    assert set(lh.SCORE_NAMES) <= set(d["maps"]) and d["initial"] == "AWFT"
    awft = np.array(d["maps"]["AWFT"]["values"])
    # the page keeps 6 decimals of scores that the explorer computed in its own pass (1e-5 relative: the same)
    assert np.allclose(awft, scores.mean("AWFT").numpy(), atol=1e-5)
    ranks = np.array(d["maps"]["AWFT"]["rank"])
    assert ranks[np.unravel_index(awft.argmax(), awft.shape)] == 1  # AWFT: high = inactive
    i = lh.SCORE_NAMES.index("AHON (LN)")
    assert np.allclose(np.array(d["prompts"][1]["scores"])[..., i], scores.values[1, ..., i].numpy(), atol=1e-5)
    profile = lh.attention_rank(smollm, PROMPTS, average=False, progress=False)
    assert d["layer_rank"]["max"] == pytest.approx(profile.max_rank.tolist())


def test_effects_join_the_menu():
    from conftest import text_model

    model = text_model(n_layers=2)
    size = np.arange(2 * model.cfg.n_heads, dtype=float).reshape(2, -1)
    ex = lh.explore(model, "a short prompt", effects={"KL when zeroed": size}, score="KL when zeroed")
    entry = ex.data["maps"]["KL when zeroed"]
    assert entry["kind"] == "effect" and entry["rank"][0][0] == 1  # the smallest effect ranks first


def test_its_plain_text_is_one_short_line():
    """A notebook keeps the plain text beside the view: the data (hundreds of kB) stay out of it."""
    from conftest import text_model

    model = text_model(n_layers=2)
    ex = lh.explore(model, ["a short prompt", "another one"], effects={"KL": np.ones((2, model.cfg.n_heads))})
    assert repr(ex) == (f"Explorer({ex.data['model']}: 2 layers x {model.cfg.n_heads} heads, 2 prompt(s); "
                        f"maps {[*lh.SCORE_NAMES, 'KL']})")


def test_bad_input_is_refused(smollm):
    with pytest.raises(ValueError, match="unknown score 'AHONX'.*AHON \\(LN\\)"):
        lh.explore(smollm, PROMPTS, score="AHONX")
    with pytest.raises(ValueError, match="more than the model's context"):
        lh.explore(smollm, "word " * (smollm.cfg.n_ctx + 10))
    with pytest.raises(ValueError, match="example prompts"):
        lh.explore(smollm, [])


def test_long_prompts_are_cut_and_say_so(smollm):
    ex = lh.explore(smollm, ["one two three " * 20], max_tokens=8)
    p = ex.data["prompts"][0]
    assert len(p["tokens"]) == 8 and p["truncated"] is True


def test_script_json_cannot_end_its_block():
    text = script_json({"t": "</script><!-- \u2028\u2029 & ]]>"})
    assert "</" not in text and "<!--" not in text and "\u2028" not in text and "\u2029" not in text
    assert json.loads(text) == {"t": "</script><!-- \u2028\u2029 & ]]>"}


def test_repr_html_is_one_fragment(explorer):
    html = explorer._repr_html_()
    assert html.count('type="application/json"') == 1 and "<html" not in html
    assert "<script>alert(1)" not in html and "<b>bold" not in html


# ---------------------------------------------------------------- in the browser


@pytest.fixture(scope="module")
def page(explorer, tmp_path_factory):
    pytest.importorskip("playwright")
    from lens_heads.report.browser import offline_page

    path = explorer.save(tmp_path_factory.mktemp("explorer") / "explorer.html")
    with offline_page(path, settle_ms=500) as (page, log):
        yield page, log


def shown_pattern(page) -> np.ndarray:
    cells = page.eval_on_selector_all(".lhx-pattern td[data-value]",
                                      "cs => cs.map(c => [+c.dataset.q, +c.dataset.k, +c.dataset.value])")
    n = max(q for q, _, _ in cells) + 1
    out = np.zeros((n, n))
    for q, k, v in cells:
        out[q, k] = v
    return out


def test_clicking_a_cell_shows_that_head_s_pattern(page, smollm):
    page, log = page
    for layer, head in [(3, 2), (20, 7)]:
        page.click(f'.lhx-grid div[data-layer="{layer}"][data-head="{head}"]')
        assert page.inner_text(".lhx-title") == f"Head L{layer}H{head}"
        expected = independent_pattern(smollm, PROMPTS[0], layer, head)
        assert np.abs(shown_pattern(page) - expected).max() <= QUANTUM
    page.select_option(".lhx-prompt", "1")
    expected = independent_pattern(smollm, MARKUP, 20, 7)
    assert np.abs(shown_pattern(page) - expected).max() <= QUANTUM
    assert log.errors == [] and log.console_errors == [] and log.outside == []


def test_the_score_menu_recolours_the_heatmap(page):
    page, _ = page
    before = page.eval_on_selector_all(".lhx-grid div", "cs => cs.map(c => c.style.background)")
    page.select_option(".lhx-score", "AHON (LN)")
    after = page.eval_on_selector_all(".lhx-grid div", "cs => cs.map(c => c.style.background)")
    assert before != after and len(after) == 30 * 9


def test_markup_in_a_prompt_stays_text(page, smollm):
    page, log = page
    page.select_option(".lhx-prompt", "1")
    assert log.dialogs == []
    assert page.locator(".lhx b").count() == 0 and page.locator(".lhx-detail script").count() == 0
    assert MARKUP in page.inner_text(".lhx-prompt-text")
    labels = page.eval_on_selector_all(".lhx-pattern tbody th", "hs => hs.map(h => h.textContent)")
    assert labels == list(smollm.to_str_tokens(MARKUP))


def test_a_task_and_its_effects_feed_the_explorer(smollm):
    from lens_heads.experiments.effects import HeadEffects

    task = lh.task_from_records([
        {"context": "Question: What is the capital of France?\nAnswer:", "choices": ["Paris", "Rome"], "gold": 0},
        {"context": "Question: What is frozen water?\nAnswer:", "choices": ["steam", "ice"], "gold": 1}], name="tiny")
    L, H = smollm.cfg.n_layers, smollm.cfg.n_heads
    values = torch.rand(2, L, H, 1, generator=torch.Generator().manual_seed(0))
    effects = HeadEffects(values=values, metrics=["kl"], metric="kl", method="ablation", item_ids=["a", "b"], meta={})
    scores = lh.score_heads(smollm, task, progress=False)
    ex = lh.explore(smollm, task, scores=scores, effects=effects, max_prompts=1)
    assert [p["text"] for p in ex.data["prompts"]] == [task.items[0].prompt]
    entry = ex.data["maps"]["effect: kl when zeroed (ablation)"]
    assert np.allclose(entry["values"], values[..., 0].abs().mean(0).numpy(), atol=1e-6)  # the page keeps 6 decimals
    assert np.allclose(ex.data["maps"]["AWFT"]["values"], scores.mean("AWFT").numpy(), atol=1e-5)
    assert "tiny" in ex.data["scores_from"]
