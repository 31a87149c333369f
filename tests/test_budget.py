"""Inheritune's GPU-hours from a GPU check's record (``lens_heads.training.budget.projection_from_record``): the
training share the record measured where it has one, else the share its evaluator reached on the measured model
nearest in size (flagged as assumed), else an error that says what to give; each against the arithmetic
FLOPs / (peak x share) / 3600 done here."""

from types import SimpleNamespace

import pytest

from lens_heads.plumbing.errors import InputError
from lens_heads.training.budget import projection_from_record, weights

FLOPS = 4.05e20  # about the gpt2-xl plan's total
RATE = 3.0e14  # FLOP/s of lens_heads' loop in the made-up record below
XL = 1.56e9  # about gpt2-xl's weights
# the evaluator's FLOP/s on three measured models, in the made-up record below
EVALUATED = [("small", 1.35e8, 4.0e13), ("mid", 4.9e8, 1.1e14), ("large", 1.24e9, 2.1e14)]


def gpu_record(**changes) -> dict:
    """A GPU check's record as gpu_check.py writes it, with training rows of both shapes."""
    rows = [dict(shape="gpt2-medium", device_name="NVIDIA H200", loop_flops_per_s=2.5e14, error=None),
            dict(shape="gpt2-xl", device_name="NVIDIA H200", loop_flops_per_s=RATE, error=None)]
    shapes = [dict(shape=name, n_params=n, evaluator_flops_per_s=rate) for name, n, rate in EVALUATED]
    record = dict(machine="2026-12-07; x86_64, 16 cores; NVIDIA H200", device="cuda", smoke=False, training=rows,
                  shapes=shapes, provenance=dict(recorded_at="2026-12-08T09:30:00+00:00"))
    return {**record, **changes}


def test_a_measured_training_share_sets_the_hours():
    p = projection_from_record(FLOPS, gpu_record(), "gpt2-xl", n_params=XL)
    # FLOPs / (peak x share) / 3600 with share = RATE / peak: 4.05e20 / 3e14 / 3600 = 375 hours
    assert p.measured and p.source == "measured on NVIDIA H200 2026-12-08"
    assert p.fraction == pytest.approx(RATE / 989e12, rel=1e-12)
    assert p.gpu_hours == pytest.approx(FLOPS / (989e12 * (RATE / 989e12)) / 3600, rel=1e-12)
    assert p.gpu_hours == pytest.approx(375.0, rel=1e-12)  # float64 rounding only
    assert projection_from_record(FLOPS, gpu_record(), "gpt2-medium", n_params=3.5e8).gpu_hours == pytest.approx(
        FLOPS / 2.5e14 / 3600, rel=1e-12)
    # another peak: the same measured FLOP/s, so the same hours at a share of that peak
    other = projection_from_record(FLOPS, gpu_record(), "gpt2-xl", n_params=XL, peak=500e12)
    assert other.fraction == pytest.approx(RATE / 500e12) and other.gpu_hours == pytest.approx(375.0, rel=1e-12)


def test_an_older_record_is_dated_by_its_machine_line():
    record = gpu_record()
    del record["provenance"]
    assert projection_from_record(FLOPS, record, "gpt2-xl", n_params=XL).source == "measured on NVIDIA H200 2026-12-07"


def test_the_weights_count_the_products_and_the_embedding():
    cfg = SimpleNamespace(n_layers=48, d_model=1600, n_heads=25, d_head=64, d_mlp=6400, d_vocab=50257)
    # per layer Q, K, V, O (4 d^2) and the MLP (2 x d x 4d): 12 d^2; then d x vocab
    assert weights(cfg) == 48 * 12 * 1600 ** 2 + 1600 * 50257


@pytest.mark.parametrize("n_params, nearest", [(XL, "large"), (3.5e8, "mid"), (1.0e8, "small"), (3.0e8, "mid")])
def test_without_a_training_rate_the_evaluators_share_on_the_nearest_model_is_assumed(n_params, nearest):
    name, n, rate = next(row for row in EVALUATED if row[0] == nearest)
    # no training row for this shape: the evaluator's rate on the model nearest n_params by ratio
    p = projection_from_record(FLOPS, gpu_record(), "cpu-xl", n_params=n_params)
    assert not p.measured and p.source.startswith("assumed: ") and f"on {name} " in p.source
    assert "measured 2026-12-08" in p.source
    assert p.fraction == pytest.approx(rate / 989e12, rel=1e-12)
    assert p.gpu_hours == pytest.approx(FLOPS / rate / 3600, rel=1e-12)  # float64 rounding only


@pytest.mark.parametrize("why, record", [
    ("the row failed", gpu_record(training=[dict(shape="gpt2-xl", device_name="NVIDIA H200", loop_flops_per_s=RATE,
                                                  error="out of GPU memory")])),
    ("a rate above the peak", gpu_record(training=[dict(shape="gpt2-xl", device_name="X", loop_flops_per_s=2e15)])),
    ("a rate that is not a number", gpu_record(training=[dict(shape="gpt2-xl", device_name="X",
                                                               loop_flops_per_s=float("nan"))])),
])
def test_a_training_row_that_measured_nothing_falls_back_to_the_evaluator(why, record):
    p = projection_from_record(FLOPS, record, "gpt2-xl", n_params=XL)
    assert not p.measured and "on large " in p.source, why
    assert p.gpu_hours == pytest.approx(FLOPS / 2.1e14 / 3600, rel=1e-12), why


@pytest.mark.parametrize("why, record", [
    ("no record", None),
    ("a CPU run", gpu_record(device="cpu")),
    ("a smoke run", gpu_record(smoke=True)),
    ("no rows at all", gpu_record(training=[], shapes=[])),
    ("evaluator rates above the peak", gpu_record(training=[], shapes=[dict(shape="x", n_params=1e9,
                                                                             evaluator_flops_per_s=2e15)])),
])
def test_without_any_gpu_rate_the_projection_asks_for_a_share(why, record):
    with pytest.raises(InputError, match="--gpu-fraction"):
        projection_from_record(FLOPS, record, "gpt2-xl", n_params=XL)
