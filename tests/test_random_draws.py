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
from lens_heads.plumbing.errors import InputError
from lens_heads.sweep.run import run_sweep
from lens_heads.sweep.unit_store import UnitStore, read_sweep_folder

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
    for spec, old in ((per_item, old_item), (per_row, old_row)):
        assert from_dict(spec.to_dict()) == spec and from_dict(old) == spec
    store = UnitStore(None, {"run": 1})
    assert store.key(per_item) != store.key(per_row)
    with pytest.raises(InputError, match="draw"):
        RandomAblation(0.1, draw="sometimes")


def _old_unit(value: dict) -> dict:
    """A unit's JSON as earlier versions wrote it: ``mode``, ``score``, ``target_fraction`` and ``threshold`` instead
    of its spec (these folders' units are baselines, random, threshold and static ablations)."""
    spec = value["spec"]
    rest = {k: v for k, v in value.items() if k != "spec"}
    return {**rest, "mode": spec["kind"], "score": spec.get("score"), "target_fraction": spec.get("fraction") or 0.0,
            "threshold": spec.get("threshold")}


def _file_as_an_earlier_version(path, entry) -> str:
    """Write the unit ``entry`` into folder ``path`` as runs of earlier versions filed it: its spec's JSON with the
    ablation under "mode" and no per-item draw, the file named by the sha256 of that JSON (sorted keys, as the file
    names are documented), and the unit in its old format (:func:`_old_unit`). Returns the file name."""
    import hashlib
    import json

    old = {("mode" if k == "ablation" else k): v for k, v in entry["key"]["ablation"].items()}
    if old.get("draw") == "per_item":
        del old["draw"]
    name = entry["value"]["key"] + "-" + hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:12]
    (path / f"{name}.json").write_text(json.dumps({"key": {**entry["key"], "ablation": old},
                                                   "value": _old_unit(entry["value"])}))
    return f"{name}.json"


def test_a_unit_filed_by_an_earlier_version_is_refiled_once_and_found(tmp_path):
    """A run folder written before specs stored ``"ablation"``: the first store to open it moves the unit to its
    spec's current file, marks the folder, and finds the unit with one lookup; later opens don't scan again."""
    import json

    from lens_heads import EvalResult
    from lens_heads.sweep.result import UnitResult
    from lens_heads.sweep.unit_store import REFILED

    fingerprint = {"run": "old"}
    spec = ThresholdAblation("AHON (LN)", 0.1, threshold=0.5)
    unit = UnitResult(spec=spec.to_dict(), realised_fraction=0.1,
                      result=EvalResult(task="t", format="cloze", items=[], chance=0.25), wall_s=1.0)
    (tmp_path / "sweep.json").write_text(json.dumps({"key": fingerprint}))  # the folder's claim, as it was
    old_name = _file_as_an_earlier_version(tmp_path, {"key": {"run": fingerprint, "ablation": spec.to_dict()},
                                                      "value": unit.to_dict()})
    store = UnitStore(tmp_path, fingerprint)
    assert not (tmp_path / old_name).exists() and store.path(spec).exists() and (tmp_path / REFILED).exists()
    assert store.load(spec) is not None and store.load(spec).to_dict() == unit.to_dict()
    assert json.loads(store.path(spec).read_text())["key"]["ablation"] == spec.to_dict()
    late = ThresholdAblation("AWFT", 0.1, threshold=0.5)  # filed the old way after the folder was re-filed
    late_name = _file_as_an_earlier_version(tmp_path, {"key": {"run": fingerprint, "ablation": late.to_dict()},
                                                       "value": {**unit.to_dict(), "key": "threshold__awft__0.1000"}})
    assert UnitStore(tmp_path, fingerprint).load(late) is None and (tmp_path / late_name).exists()  # not scanned


def test_a_sweep_folder_of_an_earlier_version_resumes_without_recomputing(model, task, tmp_path):
    """Every unit of a finished sweep filed as an earlier version filed it: the rerun re-files them and runs none,
    and its curves equal the first run's."""
    import json

    from lens_heads.sweep.unit_store import REFILED

    settings = dict(scores=["AHON (LN)"], static_scores=["AWFT"], fractions=[0.0, 0.5], seed=1, batch_size=4,
                    progress=False, out_dir=tmp_path)
    first = run_sweep(model, task, **settings)
    for path in sorted(tmp_path.glob("*__*__*.json")):
        _file_as_an_earlier_version(tmp_path, json.loads(path.read_text()))
        path.unlink()
    (tmp_path / REFILED).unlink()
    folder = read_sweep_folder(tmp_path)  # read as it was left, old-format units and all
    assert [u.key for u in folder.units] == [u.key for u in first.units]
    assert folder.to_dataframe().equals(first.to_dataframe())
    again = run_sweep(model, task, **settings)
    assert again.meta["units_run"] == 0 and again.meta["units_reused"] == len(first.units) == 4
    assert again.to_dataframe().equals(first.to_dataframe())
    assert len(list(tmp_path.glob("*__*__*.json"))) == len(first.units)  # moved, not copied
    static = [u for u in again.units if u.mode == "static"]  # the old record never held the head set it resolved
    assert [u.spec for u in static] == [{"kind": "static", "ablation": "zero", "score": "AWFT", "fraction": 0.5,
                                         "unrecorded": ["heads"]}]
    assert [u.spec for u in again.units if u.mode == "threshold"] == [
        {"kind": "threshold", "ablation": "zero", "score": "AHON (LN)", "fraction": 0.5,
         "threshold": next(u.threshold for u in first.units if u.mode == "threshold")}]


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
