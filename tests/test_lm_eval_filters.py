"""lm-eval 0.4.5's gsm8k filters and exact match on hand-written generations, each expectation worked out by hand
from the task's regexes and its ignore list (commas, "$", anything up to "#### ", a final ".")."""

import pytest

from lens_heads.evaluation.lm_eval_filters import (
    INVALID,
    flexible_extract,
    lm_eval_exact_match,
    lm_eval_normalise,
    strict_match,
)

GOLD = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nShe sold 48+24 = <<48+24=72>>72 clips.\n#### 72"


@pytest.mark.parametrize("text,strict,flexible", [
    (" She sold 24 clips.\n#### 72", "72", "72"),
    (" #### 3 is wrong, #### 4 is right", "3", "4"),            # strict takes the first "#### N", flexible the last run
    (" It costs $1,234.50 in all", INVALID, "$1,234.50"),      # no "#### ": strict finds nothing
    (" 5 apples, so 7.", INVALID, "7."),                       # a digit and its full stop are one run of two
    (" the change is -3", INVALID, "-3"),                      # a lone minus joins the single-digit alternative
    (" ####72 no space", INVALID, "72"),
    (" #### -1,000.\n", "-1,000.", "-1,000."),
    (" I do not know", INVALID, INVALID),
])
def test_filters_read_what_lm_eval_reads(text, strict, flexible):
    assert strict_match(text) == strict
    assert flexible_extract(text) == flexible


def test_exact_match_compares_after_lm_evals_ignore_list():
    assert lm_eval_normalise(GOLD) == "72"  # the reference: everything up to "#### " deleted
    assert lm_eval_exact_match("72", GOLD) and lm_eval_exact_match("72.", GOLD)
    assert lm_eval_exact_match("$1,000.", "... #### 1000") and lm_eval_exact_match("-1,000.", "#### -1000")
    assert not lm_eval_exact_match("72.0", GOLD)  # a string match, not a numeric one
    assert not lm_eval_exact_match(INVALID, GOLD)
    assert lm_eval_normalise("A. $5, B.") == "a. 5 b"  # case ignored; only the final "." goes
