"""Several ablation units in one forward (``lens_heads.ablation.stacked``): every unit kind stacked gives the records
and counts it gives alone, its rows never leak into another unit's, a sweep stacks its row-by-row units and resumes
unit by unit, and a stack that cannot fit is refused with what to change."""

import numpy as np
import pytest
import torch

import lens_heads.sweep.run as sweep_module
from conftest import LOGLIK_TOL, text_model
from lens_heads import load_task
from lens_heads.ablation.hooks import input_zeroing, mean_z, static_zeroing, threshold_zeroing
from lens_heads.ablation.random_draws import random_zeroing
from lens_heads.ablation.removed_layers import remove_layers
from lens_heads.ablation.specs import LayerRemoval, ScoreCalibration, ThresholdAblation
from lens_heads.ablation.stacked import stack_ablations
from lens_heads.data.custom_tasks import task_from_records
from lens_heads.evaluation import passes
from lens_heads.evaluation.evaluate import evaluate, evaluate_each
from lens_heads.heads.scoring import score_heads
from lens_heads.plumbing.errors import InputError
from lens_heads.sweep.run import run_sweep, run_units_stacked

# contexts and choices of different lengths, so that batches pad and an item's rows differ
RECORDS = [dict(context=f"Question {q}: which one is the answer{' here' * q}?",
                choices=[f" option {c}{' more' * ((q + i) % 3)}" for i, c in enumerate("abcd")], gold=q % 4)
           for q in range(5)]


@pytest.fixture(scope="module")
def model():
    return text_model(n_layers=3)


@pytest.fixture(scope="module")
def task():
    return task_from_records(RECORDS, name="cloze")


def every_kind(model, task, calibration):
    """One unit of each kind that stacks (None: the baseline), built fresh (each counts what it sees)."""
    means = mean_z(model, [r["context"] for r in RECORDS])
    H = model.cfg.n_heads
    return [None,
            threshold_zeroing(model, "AHON (LN)", calibration.threshold("AHON (LN)", 0.3)),
            threshold_zeroing(model, "AWFT", calibration.threshold("AWFT", 0.4), ablation="mean", means=means),
            random_zeroing(model, 0.3, seed=1),
            random_zeroing(model, 0.3, seed=1, draw="per_row"),
            static_zeroing(model, [(0, 1), (2, 3)]),
            static_zeroing(model, [(1, 0)], ablation="mean", means=means),
            input_zeroing(model, [[(i % 3, i % H)] for i in range(len(RECORDS))])]


def logprobs(result) -> np.ndarray:
    return np.concatenate([np.asarray(it.logprobs, dtype=float) for it in result.items])


def assert_same_unit(alone_ablation, alone, stacked_ablation, stacked, tol=LOGLIK_TOL):
    """The stacked unit's records and counts are the alone run's: predictions equal, summed log-likelihoods within
    ``tol`` (the stacked forward's matmuls are wider, and the alone run of a prefix-sharing unit computes its rows in
    other groupings: float32 rounding of the sums, see conftest), and what it ablated counted identically."""
    assert [it.chosen() for it in stacked.items] == [it.chosen() for it in alone.items]
    np.testing.assert_allclose(logprobs(stacked), logprobs(alone), **tol)
    if alone_ablation is None:
        return
    assert stacked_ablation.share_zeroed() == alone_ablation.share_zeroed()
    assert stacked_ablation.zeroed_by_input() == alone_ablation.zeroed_by_input()
    # the same rows in the same batches (the alone run of a prefix-sharing unit counts them in its own order)
    assert torch.equal(stacked_ablation.zeroed().float().mean(0), alone_ablation.zeroed().float().mean(0))


def test_every_unit_kind_stacked_gives_what_it_gives_alone(model, task):
    calibration = ScoreCalibration(score_heads(model, task, progress=False))
    alone_units = every_kind(model, task, calibration)
    alone = [evaluate(model, task, hooks=[u] if u else [], batch_size=3, progress=False) for u in alone_units]
    shares = [u.share_zeroed() for u in alone_units[1:]]
    assert all(0 < s < 1 for s in shares) and len(set(shares)) > 3  # the units ablate, and differently

    stacked_units = every_kind(model, task, calibration)
    stacked = evaluate_each(model, task, [stack_ablations(stacked_units)], batch_size=3, progress=False)
    assert len(stacked) == len(stacked_units)
    for a, ra, s, rs in zip(alone_units, alone, stacked_units, stacked):
        assert rs.meta["hooks"] == ra.meta["hooks"] and rs.meta["stacked_units"] == len(stacked_units)
        assert rs.meta["shared_prefix"] is None  # stacked rows run row by row
        assert_same_unit(a, ra, s, rs)

    # the order of the stack changes nothing: a unit's rows see only its own slice
    reversed_units = every_kind(model, task, calibration)[::-1]
    again = evaluate_each(model, task, [stack_ablations(reversed_units)], batch_size=3, progress=False)[::-1]
    for a, ra, s, rs in zip(alone_units, alone, reversed_units[::-1], again):
        assert_same_unit(a, ra, s, rs)


def test_a_threshold_unit_stacked_with_the_baseline_scores_only_its_own_ablated_stream(model, task):
    """The cascade: later layers score the stream the unit ablated, never the baseline rows beside it (which, read
    instead, would change what is zeroed from layer 1 on)."""
    calibration = ScoreCalibration(score_heads(model, task, progress=False))
    threshold = calibration.threshold("AWFT", 0.5)  # AWFT reads the layer's attention (its queries and keys)
    alone_unit = threshold_zeroing(model, "AWFT", threshold)
    alone = evaluate(model, task, hooks=[alone_unit], batch_size=2, progress=False)
    unit = threshold_zeroing(model, "AWFT", threshold)
    base, result = evaluate_each(model, task, [stack_ablations([None, unit])], batch_size=2, progress=False)
    assert_same_unit(alone_unit, alone, unit, result)
    plain = evaluate(model, task, batch_size=2, progress=False)
    np.testing.assert_allclose(logprobs(base), logprobs(plain), **LOGLIK_TOL)
    assert np.abs(logprobs(result) - logprobs(base)).max() > 1e-3  # the unit did change its rows


def test_a_sweep_stacks_its_row_by_row_units_with_the_same_records(model, tmp_path):
    task = load_task("arc_easy", split="validation", n=4, seed=1)
    settings = dict(scores=["AHON (LN)", "AWFT"], fractions=(0, 0.25, 0.5), static_scores=["AHON (LN)"], seed=3,
                    batch_size=4, progress=False, random="per_row")
    one = run_sweep(model, task, out_dir=tmp_path / "one", stack=1, **settings)
    stacked = run_sweep(model, task, out_dir=tmp_path / "stacked", stack=3, **settings)
    assert one.meta["stack"] == 1 and stacked.meta["stack"] == 3
    for a, b in zip(one.units, stacked.units):
        assert (a.mode, a.score, a.target_fraction) == (b.mode, b.score, b.target_fraction)
        assert a.realised_fraction == b.realised_fraction and a.item_zeroed == b.item_zeroed
        assert a.head_share == b.head_share
        assert [it.chosen() for it in a.result.items] == [it.chosen() for it in b.result.items]
        np.testing.assert_allclose(logprobs(b.result), logprobs(a.result), **LOGLIK_TOL)
        # the threshold and per-row random units stacked; the baseline and static units ran alone (they share prefixes)
        assert ("stacked_units" in b.result.meta) == (b.mode in ("threshold", "random"))


def test_an_interrupted_stacked_sweep_keeps_its_finished_units_and_resumes(model, tmp_path, monkeypatch):
    task = load_task("arc_easy", split="validation", n=3, seed=1)
    settings = dict(scores=["AHON (LN)", "AWFT", "LTHON (LN)"], fractions=(0, 0.2, 0.4), seed=0, batch_size=4,
                    progress=False, stack=2)
    full = run_sweep(model, task, out_dir=tmp_path / "full", **settings)
    groups = []
    real = sweep_module.evaluate_each

    def interrupt_after_two_groups(*args, **kwargs):
        if len(groups) == 2:
            raise KeyboardInterrupt
        groups.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep_module, "evaluate_each", interrupt_after_two_groups)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(model, task, out_dir=tmp_path / "resumed", **settings)
    # in plan order: the baseline, random 0.2, two groups of two threshold units (the second spans both shares),
    # random 0.4; the third group was interrupted
    assert len(list((tmp_path / "resumed").glob("*__*.json"))) == 3 + 2 * 2
    monkeypatch.setattr(sweep_module, "evaluate_each", real)
    resumed = run_sweep(model, task, out_dir=tmp_path / "resumed", **settings)
    assert resumed.meta["units_reused"] == 7 and resumed.meta["units_run"] == len(full.units) - 7 == 2
    for a, b in zip(full.units, resumed.units):
        assert a.realised_fraction == b.realised_fraction
        np.testing.assert_allclose(logprobs(b.result), logprobs(a.result), **LOGLIK_TOL)


def test_what_cannot_stack_is_refused_with_what_to_do(model, task):
    with pytest.raises(InputError, match="run it alone"):
        stack_ablations([static_zeroing(model, [(0, 0)]), remove_layers(model, [1])])
    with pytest.raises(InputError, match="at least one unit"):
        stack_ablations([])
    with pytest.raises(InputError, match="does not stack .* run it with run_unit"):
        run_units_stacked(model, task, [ThresholdAblation("AWFT", 0.2, threshold=0.5), LayerRemoval((1,))])
    for bad in (0, -2, 1.5, "4", True):
        with pytest.raises(InputError, match="stack must be a whole number"):
            run_sweep(model, task, stack=bad, scores=["AWFT"], fractions=(0, 0.2), progress=False)


@pytest.mark.parametrize("batch_size", ["auto", 4])
def test_a_stack_that_does_not_fit_says_to_stack_fewer_units(model, task, monkeypatch, batch_size):
    """Out of memory even at one row per unit ("auto" halves down to it) or at the given batch size: the error says
    to stack fewer units, not the allocator's message alone."""
    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(passes.backends, "run_to_resid", out_of_memory)
    units = [static_zeroing(model, [(0, 0)]) for _ in range(4)]
    with pytest.raises(InputError, match=r"4 units .* stack fewer units per forward \(e\.g\. stack=2\)"):
        evaluate_each(model, task, [stack_ablations(units)], batch_size=batch_size, progress=False)
    assert all(u.zeroed().shape[0] == 0 for u in units)  # nothing half-counted was kept by the halving


@pytest.mark.slow
def test_every_unit_kind_stacked_on_the_embedded_model(smollm):
    """The same on SmolLM2-135M (30 layers), against each unit alone on the row-by-row path: the same rows in the same
    batches, only the matmuls k times wider (equal to the bit on this machine, one thread). The tolerance, 2e-5 nats
    plus 2e-6 of the log-likelihood, absorbs a BLAS that blocks a wider matmul otherwise (a few float32 roundings of
    the activations over 30 layers). A unit that shares prefixes alone differs from its row path by the prefix
    path's own rounding (up to 2.2e-4 nats at 52 here, a per-item random unit), which tests/test_prefix.py covers."""
    task = load_task("arc_easy", split="validation", n=3, seed=0)
    calibration = ScoreCalibration(score_heads(smollm, task, progress=False))
    alone_units = every_kind(smollm, task, calibration)
    alone = [evaluate(smollm, task, hooks=[u] if u else [], batch_size=4, progress=False, _shared_prefixes=False)
             for u in alone_units]
    stacked_units = every_kind(smollm, task, calibration)
    stacked = evaluate_each(smollm, task, [stack_ablations(stacked_units)], batch_size=4, progress=False)
    for a, ra, s, rs in zip(alone_units, alone, stacked_units, stacked):
        assert_same_unit(a, ra, s, rs, dict(rtol=2e-6, atol=2e-5))
        if a is not None:
            assert torch.equal(s.zeroed(), a.zeroed())  # on the same path, even the order of the counted rows


def test_auto_batch_size_halves_the_rows_per_unit_until_the_stack_fits(model, task, monkeypatch):
    """``batch_size="auto"``: a stacked forward of more than 8 rows runs out of memory here, so 4 units settle at 2
    rows each, with the records and counts of each unit alone (what the failed attempts counted is rewound)."""
    real = passes.backends.run_to_resid

    def small_memory(model, resid, mask, **kwargs):
        out = real(model, resid, mask, **kwargs)  # the units count the rows, then the forward "fails"
        if resid.shape[0] > 8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return out

    calibration = ScoreCalibration(score_heads(model, task, progress=False))
    alone_units = every_kind(model, task, calibration)[1:5]
    alone = [evaluate(model, task, hooks=[u], batch_size=2, progress=False) for u in alone_units]
    monkeypatch.setattr(passes.backends, "run_to_resid", small_memory)
    units = every_kind(model, task, calibration)[1:5]
    stacked = evaluate_each(model, task, [stack_ablations(units)], batch_size="auto", progress=False)
    assert {r.meta["batch_size"] for r in stacked} == {2}
    for a, ra, s, rs in zip(alone_units, alone, units, stacked):
        assert_same_unit(a, ra, s, rs)


def test_generate_refuses_a_stack(model):
    from lens_heads.evaluation.generate import generate

    with pytest.raises(InputError, match="one unit"):
        generate(model, "Hello", hooks=stack_ablations([static_zeroing(model, [(0, 0)])] * 2), max_new_tokens=2)


def test_the_benchmark_compares_the_two_ways_on_the_same_plan(model):
    """``benchmarks/bench_stacked.compare_units`` (what the GPU check calls): both ways run the same units, and its
    agreement reads them unit by unit."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # the script imports timing by name
    import bench_stacked

    task = load_task("arc_easy", split="validation", n=3, seed=1)
    out = bench_stacked.compare_units(model, task, stack=2, scores=["AHON (LN)", "AWFT"], fractions=(0, 0.3),
                                      batch_size=4, seed=0)
    assert out["units"] == 1 + 1 + 2 and out["stack"] == 2
    assert out["predictions"] == out["units"] * len(task) and out["predictions_equal"] == out["predictions"]
    assert out["shares_equal"] and out["max_abs_loglik_diff"] <= 1e-4
    assert out["one"]["units_per_s"] > 0 and out["stacked"]["units_per_s"] > 0
