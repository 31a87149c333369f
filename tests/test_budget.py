"""Inheritune's GPU-hours from a GPU check's record (``lens_heads.training.budget.projection_from_record``): the
training share the record measured where it has one, the assumed share (flagged) where not; each against the
arithmetic FLOPs / (peak x share) / 3600 done here."""

import pytest

from lens_heads.training.budget import (
    ASSUMED_FRACTION_OF_PEAK,
    ASSUMED_SOURCE,
    GPU_PEAK_FLOPS,
    projection_from_record,
)

FLOPS = 4.05e20  # about the gpt2-xl plan's total
RATE = 3.0e14  # FLOP/s of lens_heads' loop in the made-up record below


def gpu_record(**changes) -> dict:
    """A GPU check's record as gpu_check.py writes it, with training rows of both shapes."""
    rows = [dict(shape="gpt2-medium", device_name="NVIDIA H200", loop_flops_per_s=2.5e14, error=None),
            dict(shape="gpt2-xl", device_name="NVIDIA H200", loop_flops_per_s=RATE, error=None)]
    record = dict(machine="2026-12-07; x86_64, 16 cores; NVIDIA H200", device="cuda", smoke=False, training=rows,
                  provenance=dict(recorded_at="2026-12-08T09:30:00+00:00"))
    return {**record, **changes}


def test_a_measured_training_share_sets_the_hours():
    p = projection_from_record(FLOPS, gpu_record(), "gpt2-xl")
    # FLOPs / (peak x share) / 3600 with share = RATE / peak: 4.05e20 / 3e14 / 3600 = 375 hours
    assert p.measured and p.source == "measured on NVIDIA H200 2026-12-08"
    assert p.fraction == pytest.approx(RATE / 989e12, rel=1e-12)
    assert p.gpu_hours == pytest.approx(FLOPS / (989e12 * (RATE / 989e12)) / 3600, rel=1e-12)
    assert p.gpu_hours == pytest.approx(375.0, rel=1e-12)  # float64 rounding only
    assert projection_from_record(FLOPS, gpu_record(), "gpt2-medium").gpu_hours == pytest.approx(
        FLOPS / 2.5e14 / 3600, rel=1e-12)
    # another peak: the same measured FLOP/s, so the same hours at a share of that peak
    other = projection_from_record(FLOPS, gpu_record(), "gpt2-xl", peak=500e12)
    assert other.fraction == pytest.approx(RATE / 500e12) and other.gpu_hours == pytest.approx(375.0, rel=1e-12)


def test_an_older_record_is_dated_by_its_machine_line():
    record = gpu_record()
    del record["provenance"]
    assert projection_from_record(FLOPS, record, "gpt2-xl").source == "measured on NVIDIA H200 2026-12-07"


def assumed_hours(flops: float) -> float:
    return flops / (989e12 * 0.44) / 3600


@pytest.mark.parametrize("why, record, shape", [
    ("no record", None, "gpt2-xl"),
    ("a CPU run", gpu_record(device="cpu"), "gpt2-xl"),
    ("a smoke run", gpu_record(smoke=True), "gpt2-xl"),
    ("no training rows (the record before this measurement)", gpu_record(training=[]), "gpt2-xl"),
    ("no row of the shape", gpu_record(), "cpu-xl"),
    ("the row failed", gpu_record(training=[dict(shape="gpt2-xl", device_name="NVIDIA H200", loop_flops_per_s=RATE,
                                                  error="out of GPU memory")]), "gpt2-xl"),
    ("a rate above the peak", gpu_record(training=[dict(shape="gpt2-xl", device_name="X", loop_flops_per_s=2e15)]),
     "gpt2-xl"),
    ("a rate that is not a number", gpu_record(training=[dict(shape="gpt2-xl", device_name="X",
                                                               loop_flops_per_s=float("nan"))]), "gpt2-xl"),
])
def test_without_a_measurement_the_share_is_assumed_and_says_so(why, record, shape):
    p = projection_from_record(FLOPS, record, shape)
    assert not p.measured and p.source == ASSUMED_SOURCE == "assumed: the CPU evaluator's share", why
    assert p.fraction == ASSUMED_FRACTION_OF_PEAK == 0.44 and p.peak == GPU_PEAK_FLOPS == 989e12
    assert p.gpu_hours == pytest.approx(assumed_hours(FLOPS), rel=1e-12)

