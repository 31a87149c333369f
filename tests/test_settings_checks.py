"""Settings values refuse a bad field when they are made, each naming the field and what to give."""

import pytest

import lens_heads as lh
from lens_heads.plumbing.errors import InputError
from lens_heads.training.config import TrainConfig


@pytest.mark.parametrize("field, value, says", [
    ("confidence", 95, r"confidence=95.*\(0, 1\)"), ("confidence", 0.0, "confidence"), ("confidence", 1, "confidence"),
    ("n_resamples", 0, "n_resamples=0"), ("n_resamples", 2.5, "n_resamples"), ("depth_bins", 0, "depth_bins"),
    ("cdf_points", 1, "cdf_points"), ("seed", -1, "seed"), ("shares", (0.0,), "shares"), ("shares", 0.1, "shares"),
    ("views", ("pooled", "rows"), "views"),
])
def test_distribution_settings_check_every_field(field, value, says):
    with pytest.raises(InputError, match=says):
        lh.DistributionSettings(**{field: value})


def test_distribution_settings_keep_good_values():
    settings = lh.DistributionSettings(confidence=0.9, n_resamples=1, depth_bins=2, cdf_points=2, shares=[0.2])
    assert (settings.confidence, settings.n_resamples, settings.shares) == (0.9, 1, (0.2,))


def test_train_config_refuses_a_schedule_that_would_climb():
    with pytest.raises(InputError, match=r"lr=0.0001, min_lr=0.001.*min_lr <= lr"):
        TrainConfig(lr=1e-4, min_lr=1e-3)
    with pytest.raises(InputError, match="min_lr"):
        TrainConfig(min_lr=-1e-5)
    assert TrainConfig(lr=1e-4, min_lr=1e-4).min_lr == 1e-4  # a constant rate after warm-up is allowed
