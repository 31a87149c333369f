"""Random zeroing drawn per forward row (the authors' baseline) beside the per-item draw: each choice of an item loses
its own heads, no prefix is shared for it, the log-likelihoods are those of each row zeroed on its own, and sweeps
keep the two draws apart."""

import numpy as np
import pytest
import torch

from conftest import load_script, text_model
from lens_heads.ablation.hooks import zero_heads
from lens_heads.ablation.random_draws import random_zeroing
from lens_heads.ablation.specs import RandomAblation, ThresholdAblation, from_dict
from lens_heads.data.custom_tasks import task_from_records
from lens_heads.data.rows import build_rows
from lens_heads.evaluation.evaluate import evaluate
from lens_heads.experiments.sweep_run import run_sweep
from lens_heads.experiments.unit_store import UnitStore
from lens_heads.plumbing.errors import InputError

RECORDS = [dict(context=f"Question {q}: which one is the answer here?", choices=[f" option {c} for {q}" for c in
                                                                             "abcd"], gold=q % 4) for q in range(3)]


@pytest.fixture(scope="module")
def model():
    return text_model()


@pytest.fixture(scope="module")
def task():
    return task_from_records(RECORDS, name="cloze")


def drawn_mask(seed: int, entropy: list[int], p: float, shape) -> torch.Tensor:
    """The documented draw: U[0, 1) of shape [layer, head] from a torch generator seeded by numpy's SeedSequence of
    ``entropy`` (``[seed, item]``; a row adds its first choice + 1)."""
    state = int(np.random.SeedSequence([seed, *entropy]).generate_state(1)[0])
    return torch.rand(*shape, generator=torch.Generator().manual_seed(state)) < p


def reference_logprob(model, row, choice: int, heads: torch.Tensor) -> float:
    """The choice's summed log-likelihood with ``heads`` zeroed on this row alone, by a plain forward of its tokens."""
    pairs = [(layer, head) for layer, head in zip(*torch.nonzero(heads, as_tuple=True))]
    (_, first, ids), = [r for r in row.reads if r[0] == choice]
    with torch.no_grad():
        logits = model.run_with_hooks(torch.tensor([row.tokens]), fwd_hooks=zero_heads(pairs) if pairs else [])
    logprobs = torch.log_softmax(logits[0].double(), -1)
    return float(sum(logprobs[first + k, token] for k, token in enumerate(ids)))


def test_per_row_draw_gives_each_choice_its_own_heads_without_shared_prefixes(model, task):
    p, seed = 0.5, 7
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    per_row = random_zeroing(model, p, seed, draw="per_row")
    result = evaluate(model, task, hooks=[per_row], batch_size=3, progress=False)
    assert per_row.prefix_scope is None and result.meta["shared_prefix"] is None  # every row runs whole
    rows = build_rows(model, list(task))
    assert len(rows) == 12  # one row per choice: the rows the draw tells apart
    masks = {}
    for row in rows:
        (choice, _, _), = row.reads
        masks[row.item, choice] = drawn_mask(seed, [row.item, choice + 1], p, shape)
        # the evaluation's log-likelihood is that of this row zeroed with its own draw (float32 forward, summed in
        # float64 here; the evaluator's fused attention and batching move the last float32 bits: 1e-4 absolute on
        # log-likelihoods of about -50)
        assert result.items[row.item].logprobs[choice] == pytest.approx(
            reference_logprob(model, row, choice, masks[row.item, choice]), abs=1e-4)
    for item in range(len(task)):
        assert len({tuple(masks[item, c].flatten().tolist()) for c in range(4)}) > 1  # choices lose other heads
    assert per_row.zeroed().sum().item() == sum(int(m.sum()) for m in masks.values())
    assert per_row.share_zeroed() == pytest.approx(float(torch.stack(list(masks.values())).float().mean()))


def test_per_item_draw_keeps_one_draw_for_all_choices_and_shares_the_prefix(model, task):
    p, seed = 0.5, 7
    per_item = random_zeroing(model, p, seed)
    result = evaluate(model, task, hooks=[per_item], batch_size=3, progress=False)
    assert result.meta["shared_prefix"] == "item"
    shape = (model.cfg.n_layers, model.cfg.n_heads)
    rows = build_rows(model, list(task))
    for row in rows:
        (choice, _, _), = row.reads
        heads = drawn_mask(seed, [row.item], p, shape)
        assert result.items[row.item].logprobs[choice] == pytest.approx(
            reference_logprob(model, row, choice, heads), abs=1e-4)
    # the per-row draw of row 0 is not the item's draw (SeedSequence pads with zeros: rows are mixed in as k + 1)
    assert not torch.equal(drawn_mask(seed, [0], p, shape), drawn_mask(seed, [0, 1], p, shape))


def test_per_row_draws_are_nested_and_need_row_keys_where_inputs_repeat(model):
    tokens = torch.randint(0, 1000, (4, 6))
    zeroed = []
    for p in (0.3, 0.6):
        ablation = random_zeroing(model, p, 2, draw="per_row")
        with ablation.batch(None, inputs=[5, 5, 6, 6], rows=[0, 1, 0, 1]):
            model.run_with_hooks(tokens, fwd_hooks=ablation.hooks)
        zeroed.append(ablation.zeroed())
    assert bool((zeroed[0] <= zeroed[1]).all())  # a head zeroed at 30% stays zeroed at 60%
    assert not torch.equal(zeroed[1][0], zeroed[1][1])  # two rows of input 5
    ablation = random_zeroing(model, 0.5, 2, draw="per_row")
    with pytest.raises(InputError, match="rows of one input apart"):
        with ablation.batch(None, inputs=[5, 5, 6, 6]):
            model.run_with_hooks(tokens, fwd_hooks=ablation.hooks)
    with pytest.raises(InputError, match="draw must be one of"):
        random_zeroing(model, 0.5, draw="per_choice")


def test_the_spec_keeps_the_draw_in_its_key_and_reads_old_keys():
    per_item, per_row = RandomAblation(0.1, 3), RandomAblation(0.1, 3, draw="per_row")
    assert per_item.to_dict() == {"kind": "random", "fraction": 0.1, "seed": 3, "ablation": "zero",
                                  "draw": "per_item"}
    assert per_row.to_dict() == {"kind": "random", "fraction": 0.1, "seed": 3, "ablation": "zero", "draw": "per_row"}
    # what runs of earlier versions stored: the ablation under "mode", and no draw where it was per item
    old_item = {"kind": "random", "fraction": 0.1, "seed": 3, "mode": "zero"}
    old_row = {"kind": "random", "fraction": 0.1, "seed": 3, "mode": "zero", "draw": "per_row"}
    assert per_item.legacy_dict() == old_item and per_row.legacy_dict() == old_row
    for spec, old in ((per_item, old_item), (per_row, old_row)):
        assert from_dict(spec.to_dict()) == spec and from_dict(old) == spec
    store = UnitStore(None, {"run": 1})
    assert store.key(per_item) != store.key(per_row)
    with pytest.raises(InputError, match="draw"):
        RandomAblation(0.1, draw="sometimes")


def test_a_unit_filed_by_an_earlier_version_is_found(tmp_path):
    """A run folder written before specs stored ``"ablation"``: its unit file is named by the hash of the spec's
    JSON with ``"mode"`` (built here by hand: sha256 of the sorted JSON, as the file names are documented), and a
    rerun finds it instead of recomputing."""
    import hashlib
    import json

    from lens_heads import EvalResult
    from lens_heads.experiments.sweep_result import UnitResult

    fingerprint = {"run": "old"}
    store = UnitStore(tmp_path, fingerprint)
    spec = ThresholdAblation("AHON (LN)", 0.1, threshold=0.5)
    old = {"kind": "threshold", "score": "AHON (LN)", "fraction": 0.1, "threshold": 0.5, "mode": "zero"}
    assert spec.legacy_dict() == old
    name = hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:12]
    unit = UnitResult(mode="threshold", score="AHON (LN)", target_fraction=0.1, threshold=0.5, realised_fraction=0.1,
                      result=EvalResult(task="t", format="cloze", items=[], chance=0.25), wall_s=1.0)
    entry = {"key": {"run": fingerprint, "ablation": old}, "value": unit.to_dict()}
    (tmp_path / f"threshold__AHON_LN__0.1000-{name}.json").write_text(json.dumps(entry))
    assert store.load(spec) is not None and store.load(spec).to_dict() == unit.to_dict()
    assert store.path(spec).name != f"threshold__AHON_LN__0.1000-{name}.json"  # new units are filed by "ablation"


def test_sweeps_record_the_draw_and_never_mix_the_two(model, task, tmp_path):
    settings = dict(scores=[], fractions=[0.0, 0.5], seed=1, batch_size=4, progress=False)
    per_item = run_sweep(model, task, out_dir=tmp_path / "a", **settings)
    per_row = run_sweep(model, task, out_dir=tmp_path / "b", random="per_row", **settings)
    assert per_item.meta["random_draw"] == "per_item" and per_row.meta["random_draw"] == "per_row"
    assert "random_draw" not in per_item.meta["fingerprint"]  # folders of earlier runs keep their fingerprint
    assert per_row.meta["fingerprint"]["random_draw"] == "per_row"
    (unit_item,), (unit_row,) = ([u for u in s.units if u.mode == "random"] for s in (per_item, per_row))
    assert unit_row.result.meta["shared_prefix"] is None and unit_item.result.meta["shared_prefix"] == "item"
    assert unit_item.realised_fraction != unit_row.realised_fraction  # other draws
    with pytest.raises(InputError, match="another configuration"):
        run_sweep(model, task, out_dir=tmp_path / "a", random="per_row", **settings)
    with pytest.raises(InputError, match="random must be one of"):
        run_sweep(model, task, random="per_choice", **settings)


def test_the_authors_preset_of_the_sweep_script():
    sweep = load_script("sweep")
    args = sweep.parse_args(["--authors"])
    assert args.random == "per_row" and args.static_scores == () and args.tag == "authors"
    assert args.scores[-1] == "LTHON (HN)" and len(args.scores) == 13
    assert args.fractions == (0.0, .05, .1, .15, .2, .25, .3)
    assert sweep.parse_args(["--authors", "--random", "per_item"]).random == "per_item"  # flags still win
    assert sweep.parse_args([]).random == "per_item"
