"""The Inheritune paper's zero-shot evaluation of a trained model: its tasks, each scored by the accuracy the paper
reports for it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lens_heads.data.rows import within_context
from lens_heads.data.tasks import INHERITUNE_SCORINGS, TASKS, load_task
from lens_heads.evaluation.evaluate import ACC_NORM, evaluate

if TYPE_CHECKING:  # TransformerLens 3.9 only
    from transformer_lens import HookedTransformer

# The paper's zero-shot tasks and the accuracy reported for each (lm-eval names: "sum" = acc, "per_char" =
# acc_norm, which the paper reports for HellaSwag), from the task registry (TaskSpec.inheritune_scoring). A task
# asked for that lens_heads.data.tasks does not ship is reported as unavailable.
PAPER_TASKS = INHERITUNE_SCORINGS


def zero_shot(model: HookedTransformer, tasks: dict[str, str] | None = None, *, n: int | None = None, seed: int = 0,
              batch_size: int = 16) -> list[dict]:
    """Zero-shot accuracy of ``model`` on ``tasks`` ({task: metric}, default `PAPER_TASKS`), ``n`` items each
    (seeded sample of the task's default split, named in each row with acc_norm's definition); items longer than
    the model's context are dropped and counted."""
    rows = []
    for name, metric in (PAPER_TASKS if tasks is None else tasks).items():
        if name not in TASKS:
            rows.append({"task": name, "available": False, "note": f"not in lens_heads.data.tasks.TASKS {TASKS}"})
            continue
        fitting, dropped = within_context(model, load_task(name, n=n, seed=seed, shots=0))
        res = evaluate(model, fitting, batch_size=batch_size, progress=False, primary=metric)
        rows.append({**res.summary(), "split": fitting.split, "acc_norm": ACC_NORM, "available": True,
                     "dropped_longer_than_context": dropped})
    return rows
