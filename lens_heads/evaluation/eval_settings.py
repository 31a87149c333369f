"""The evaluation settings as one frozen value: how the forward rows are built and read, and how they are batched.

Every function that evaluates (``evaluate``, ``evaluate_each``, ``score_heads``, ``run_sweep``, ``ranking_sweep``,
``head_effects``, ``layer_scores``, ...) takes ``settings=EvalSettings(...)`` and records it whole in its result's
``meta["settings"]``; the same names as keyword arguments stay the friendly front door and build it
(``evaluate(model, task, batch_size=4)`` is ``evaluate(model, task, settings=EvalSettings(batch_size=4))``; given
together, the keywords override the value's fields). The value is checked when it is made, so a bad setting is
refused before any work, and it is hashable: one value can key a cache or be shared by a whole experiment.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from lens_heads.data.chat import check_chat_setting
from lens_heads.data.rows import DEFAULT_PROTOCOL, check_protocol
from lens_heads.evaluation.batching import check_batch_size
from lens_heads.evaluation.results import check_primary
from lens_heads.plumbing.errors import InputError
from lens_heads.plumbing.values import laid_over

ATTENTION = ("fused", "eager")


@dataclass(frozen=True)
class EvalSettings:
    """How an evaluation runs (each field as :func:`lens_heads.evaluation.evaluate.evaluate` documents it).

    ``batch_size``: rows per forward pass, or ``"auto"`` (the largest that fits). ``primary``: the choice scoring
    behind accuracy (``"sum"``, lm-eval's acc; ``"per_token"``; ``"per_char"``, lm-eval's acc_norm). ``protocol``:
    the forward rows (``"lm-eval"``, the paper's; ``"tl"``). ``apply_chat_template``: ``False``, ``True``,
    ``"single_turn"`` or ``"auto"`` (by the model's name), as lm-eval renders chats. ``attention``: ``"fused"``
    (SDPA where no hook reads the pattern; the same log-likelihoods to float rounding) or ``"eager"``."""

    batch_size: int | str = 8
    primary: str = "sum"
    protocol: str = DEFAULT_PROTOCOL
    apply_chat_template: bool | str = False
    attention: str = "fused"

    def __post_init__(self):
        check_batch_size(self.batch_size)
        check_primary(self.primary)
        check_protocol(self.protocol)
        check_chat_setting(self.apply_chat_template)
        if self.attention not in ATTENTION:
            raise InputError(f"attention must be one of {ATTENTION}, got {self.attention!r}")

    def to_dict(self) -> dict[str, Any]:
        """The settings as plain JSON values (what a result's ``meta["settings"]`` holds)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EvalSettings":
        """The settings :meth:`to_dict` wrote (a field left out takes its default)."""
        return eval_settings(None, dict(data))

    def rows(self) -> dict[str, Any]:
        """The settings that decide the forward rows: ``protocol`` and ``apply_chat_template``."""
        return dict(protocol=self.protocol, apply_chat_template=self.apply_chat_template)

    def replace(self, **changes) -> "EvalSettings":
        """A copy with ``changes`` (checked as a new value is)."""
        return eval_settings(self, changes)


FIELDS = tuple(f.name for f in dataclasses.fields(EvalSettings))


def eval_settings(settings: EvalSettings | None = None, options: Mapping[str, Any] | None = None) -> EvalSettings:
    """``settings`` (default: ``EvalSettings()``) with the keyword ``options`` a function was called with laid over
    it; an option that is not a setting is refused by name."""
    return laid_over(EvalSettings, settings, dict(options or {}), argument="settings", what="evaluation settings")


@dataclass(frozen=True)
class EvalRun:
    """One evaluation call: its settings and what it adds for this call only: the progress bar, the first item's
    index (a block of a larger task numbers its items from there), whether shared prefixes may be used, and what
    becomes of non-finite items (``settle=False``: left for the caller, a torchrun rank whose gathered records are
    settled together)."""

    settings: EvalSettings
    progress: bool = True
    first_input: int = 0
    shared_prefixes: bool = True
    nonfinite: str = "raise"
    settle: bool = True

    def again(self, **changes) -> "EvalRun":
        return dataclasses.replace(self, **changes)
