"""Ablation specs: a plan survives JSON and rebuilds hooks with the same effect; calibration resolves a spec to the
threshold and heads worked out here from the scores by numpy; the one most-inactive rule on hand-made means."""

import json

import numpy as np
import pytest
import torch
from transformer_lens.utils import get_act_name

from lens_heads.ablation.specs import (
    SPECS,
    UNIT_MODES,
    InputAblation,
    LayerRemoval,
    RandomAblation,
    ScoreCalibration,
    StaticAblation,
    ThresholdAblation,
    Unablated,
    from_dict,
)
from lens_heads.heads.scores import most_inactive
from lens_heads.heads.scoring import score_heads
from lens_heads.models.loading import tiny_model
from lens_heads.stats.curves import CURVE_MODES


def _run(model, tokens, mask, spec):
    """Logits with the spec's hooks, one batch told its inputs explicitly."""
    ablation = spec.build(model)
    if ablation is None:
        return model(tokens, attention_mask=mask.long())
    with ablation.batch(mask, first=0), torch.no_grad():
        return model.run_with_hooks(tokens, attention_mask=mask.long(), fwd_hooks=ablation.hooks)


@torch.no_grad()
def test_a_plan_round_trips_through_json_and_rebuilds_the_same_ablation():
    model = tiny_model("llama", seed=2, n_layers=2)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.cfg.d_vocab, (3, 7), generator=g)
    mask = torch.ones(3, 7, dtype=torch.bool)
    calibration = ScoreCalibration(score_heads(model, tokens, attention_mask=mask, progress=False))
    plan = [Unablated(), RandomAblation(0.4, seed=5), ThresholdAblation("AHON (LN)", 0.3),
            StaticAblation(score="AWFT", fraction=0.25), StaticAblation(heads=[(0, 1), (1, 2)], score="hand")]
    resolved = [spec.resolve(calibration) for spec in plan]
    stored = json.loads(json.dumps([spec.to_dict() for spec in resolved]))
    again = [from_dict(d) for d in stored]
    assert again == resolved and [from_dict(json.loads(json.dumps(s.to_dict()))) for s in plan] == plan
    for spec, copy in zip(resolved, again):
        torch.testing.assert_close(_run(model, tokens, mask, copy), _run(model, tokens, mask, spec), rtol=0, atol=0)

    # the static set's effect, worked out without the hooks: zero z of those heads by hand
    def zero(z, hook):
        layer = int(hook.name.split(".")[1])
        z = z.clone()
        z[:, :, [h for (l, h) in again[-1].heads if l == layer]] = 0
        return z

    by_hand = model.run_with_hooks(tokens, attention_mask=mask.long(),
                                   fwd_hooks=[(get_act_name("z", layer), zero) for layer in range(2)])
    torch.testing.assert_close(_run(model, tokens, mask, again[-1]), by_hand)
    with pytest.raises(ValueError, match="no threshold yet"):
        ThresholdAblation("AWFT", 0.1).build(model)
    with pytest.raises(ValueError, match="unknown ablation kind"):
        from_dict({"kind": "prune"})


def test_the_spec_kinds_are_the_baseline_and_the_curve_modes():
    """A unit's mode is its spec's kind (UNIT_MODES, what read_sweep_folder orders by), and CurveKey accepts the curve
    modes of the layer below (CURVE_MODES): the two must name the same modes, and each spec's curve its own."""
    assert UNIT_MODES == tuple(SPECS) and UNIT_MODES[0] == "baseline"
    assert sorted(UNIT_MODES[1:]) == sorted(CURVE_MODES)
    one = {"random": RandomAblation(0.1), "threshold": ThresholdAblation("AWFT", 0.1),
           "static": StaticAblation(heads=[(0, 1)], score="hand"), "per_input": InputAblation((((0, 1),),), "hand"),
           "layers": LayerRemoval((1,))}
    assert sorted(one) == sorted(CURVE_MODES) and Unablated().curve is None
    assert all(type(spec) is SPECS[kind] and spec.curve.mode == kind for kind, spec in one.items())


def test_calibration_resolves_thresholds_and_heads_as_numpy_reads_them():
    model = tiny_model("gpt2", seed=1, n_layers=2)
    tokens = torch.randint(0, model.cfg.d_vocab, (4, 6), generator=torch.Generator().manual_seed(1))
    scores = score_heads(model, tokens, progress=False)
    calibration = ScoreCalibration(scores)
    awft = scores.score("AWFT").double().numpy()  # '>' score: high is inactive
    spec = ThresholdAblation("AWFT", 0.2).resolve(calibration)
    assert spec.threshold == pytest.approx(np.quantile(awft.reshape(-1), 0.8))
    k = round(0.25 * awft[0].size)
    highest = np.argsort(-awft.mean(0).reshape(-1), kind="stable")[:k]
    heads = StaticAblation(score="AWFT", fraction=0.25).resolve(calibration).heads
    assert [layer * awft.shape[2] + head for layer, head in heads] == highest.tolist()


def test_most_inactive_orders_by_the_inactive_side_and_keeps_layer_head_order_among_equals():
    mean = torch.tensor([[0.5, 0.1, 0.9], [0.1, 0.7, 0.9]])
    assert most_inactive(mean, "<", 3) == [(0, 1), (1, 0), (0, 0)]
    assert most_inactive(mean, ">", 3) == [(0, 2), (1, 2), (1, 1)]
    assert most_inactive(mean, ">", 0) == []
    with pytest.raises(ValueError, match="direction"):
        most_inactive(mean, "=", 1)


def test_lm_eval_model_args_are_the_sweep_s_specs():
    """Each ``model_args`` ablation form parses into the spec a sweep's plan would hold for the same ablation."""
    from lens_heads.harness import model_args

    cases = {
        ("threshold:AHON (LN):0.2", None, None): ThresholdAblation("AHON (LN)", 0.2),
        ("static:LTHON:0.1", None, None): StaticAblation(score="LTHON", fraction=0.1),
        ("random:0.3:per_row:7", None, None): RandomAblation(0.3, seed=7, draw="per_row"),
        ("random:0.3", None, None): RandomAblation(0.3),
        (None, "3.1;10.4", None): StaticAblation(heads=((3, 1), (10, 4))),
        (None, None, "23;24"): LayerRemoval((23, 24)),
        (None, None, None): Unablated(),
    }
    for (ablation, heads, layers), spec in cases.items():
        assert model_args.parse_ablation(ablation, heads, layers).to_spec() == spec
    block = model_args.parse_ablation(layers="2", layer_part="block").to_spec()
    assert block == LayerRemoval((2,), part="block")
    import ast
    from pathlib import Path

    package = Path(model_args.__file__).resolve().parents[1]
    defined = [path.name for path in package.rglob("*.py") for node in ast.parse(path.read_text()).body
               if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DRAWS" for t in node.targets)]
    assert defined == ["hooks.py"]  # the random draws are named once, where the head ablations are
