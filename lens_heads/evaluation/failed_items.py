"""Items whose log-likelihoods are not finite never become a prediction: the evaluation refuses them, or, where the
caller asks for it (``nonfinite="exclude"``), records them as failed and leaves them out of every metric.

A NaN log-likelihood would otherwise be "chosen" by ``argmax`` (NumPy picks the first NaN), so a diverged model or a
float16 overflow would score as a model that always answers the first choice.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Sequence

from lens_heads.evaluation.results import EvalResult
from lens_heads.plumbing.errors import InputError, NonFiniteError

NONFINITE = ("raise", "exclude")  # what an evaluation does with items whose log-likelihoods are not finite
SHOWN = 5  # item ids an error names before "and N more"


def check_nonfinite(nonfinite: str) -> None:
    if nonfinite not in NONFINITE:
        raise InputError(f"nonfinite must be one of {NONFINITE}, got {nonfinite!r}")


def failed_ids(result: EvalResult) -> list[str]:
    """The ids of the items with a NaN or infinite log-likelihood in any choice."""
    return [it.id for it in result.items if not all(math.isfinite(v) for v in it.logprobs)]


def settle(results: Sequence[EvalResult], nonfinite: str, where: Callable[[str], str]) -> list[EvalResult]:
    """``results`` with their non-finite items refused (``"raise"``: a :class:`NonFiniteError` naming them and
    ``where(first item id)``, a sentence saying where that item's forward went non-finite) or excluded
    (``"exclude"``: ``meta["failed_items"]`` lists them, ``meta["n_failed"]`` counts them)."""
    settled = []
    for k, result in enumerate(results):
        failed = failed_ids(result)
        if failed and (nonfinite == "raise" or len(failed) == result.n):
            hooks = result.meta.get("hooks") or ["no hooks"]
            shown = ", ".join(failed[:SHOWN]) + (f" and {len(failed) - SHOWN} more" if len(failed) > SHOWN else "")
            advice = ("every item failed, so there is nothing to exclude" if nonfinite == "exclude" else
                      "pass nonfinite='exclude' to leave them out (counted in the result's meta['n_failed'])")
            raise NonFiniteError(
                f"{len(failed)} of {result.n} items of {result.task} have NaN or infinite log-likelihoods "
                f"(hook set {k}: {'; '.join(hooks)}): {shown}; on item {failed[0]}, {where(failed[0])}. No accuracy "
                f"is computed from them: {advice}")
        out = set(failed)
        settled.append(replace(result, items=[it for it in result.items if it.id not in out],
                               meta=dict(result.meta, n_failed=len(failed), failed_items=failed)))
    return settled
