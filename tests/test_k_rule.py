"""The k rule (`lens_heads.growth.k_rule`) on hand-made rank profiles."""

import pytest

from lens_heads.growth.k_rule import choose_k
from lens_heads.plumbing.errors import InputError


def profile(lazy: str, aggregation: str = "matrix") -> dict:
    """A rank profile's flags from a string: ``L`` a lazy layer, ``.`` an active one."""
    return {"lazy": [c == "L" for c in lazy], "aggregation": aggregation}


def test_k_is_the_first_deep_lazy_layer_and_every_flag_is_listed():
    # 10 layers, deep half from layer 5: flags at 2 (early, listed only), 6 and 7
    got = choose_k(profile("..L...LL.."))
    assert (got.k, got.flagged, got.deep_flagged, got.first_flagged) == (6, (2, 6, 7), (6, 7), 2)
    # SmolLM2's loop windows flagged 8, 14, 23, 24 of 30 (deep half from 15): k = 23, not 8
    smol = choose_k(profile("".join("L" if i in (8, 14, 23, 24) else "." for i in range(30))))
    assert (smol.k, smol.flagged, smol.deep_flagged, smol.first_flagged) == (23, (8, 14, 23, 24), (23, 24), 8)


def test_without_a_deep_lazy_layer_k_is_half_the_depth():
    assert choose_k(profile(".L......")).k == 4  # an early flag only
    assert choose_k(profile(".......")).k == 3  # 7 layers: the deep half starts at 3
    assert choose_k(profile(".......")).first_flagged is None
    assert choose_k(profile("L.")).k == 1  # the smallest depth with a deep half


def test_only_the_papers_aggregation_and_a_deep_half_are_accepted():
    with pytest.raises(InputError, match="aggregation 'matrix'.*got aggregation 'per_input'"):
        choose_k(profile("..LL", aggregation="per_input"))
    with pytest.raises(InputError, match="no deep half"):
        choose_k(profile("L"))
