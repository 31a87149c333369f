"""Inheritune (Sanyal et al., arXiv 2404.08634): a smaller GPT-2 that inherits the potent early layers of a
larger one, is trained, and grows while it is worse than its reference.

The namespace ``lh.inheritune``: the initialisations that copy weights (`lens_heads.growth.inherit`: inherit,
grow, stack and the baselines' warm starts), a run's settings (`lens_heads.growth.inheritune_config`), the run
(`lens_heads.growth.inheritune_run`), its stages (`lens_heads.growth.inheritune_result`) and the paper's
zero-shot evaluation (`lens_heads.growth.zero_shot`).
"""

from lens_heads.growth.inherit import (
    BLOCK_PARTS,
    PARTS,
    distilbert_init,
    distilbert_layers,
    grow,
    hybrid_stack,
    inherit,
    inherit_first_layers,
    inherit_later_layers,
    inherited_names,
    same_size_random,
    stack,
)
from lens_heads.growth.inheritune_config import (
    ABLATIONS,
    BASELINE_METHODS,
    DISTILLATIONS,
    GROW_FROM,
    GROWTH,
    INHERITANCE_ABLATIONS,
    WARM_STARTS,
    InherituneConfig,
    half_width_shape,
)
from lens_heads.growth.inheritune_result import InherituneResult, Stage, load_result
from lens_heads.growth.inheritune_run import planned_stages, rank_tokens, run_inheritune
from lens_heads.growth.zero_shot import PAPER_TASKS, zero_shot

__all__ = [
    # the initialisations that copy weights
    "inherit", "inherit_first_layers", "inherit_later_layers", "grow", "stack", "hybrid_stack", "distilbert_init",
    "distilbert_layers", "same_size_random", "inherited_names", "BLOCK_PARTS", "PARTS",
    # a run's settings
    "InherituneConfig", "ABLATIONS", "INHERITANCE_ABLATIONS", "WARM_STARTS", "DISTILLATIONS", "BASELINE_METHODS",
    "GROW_FROM", "GROWTH", "half_width_shape",
    # the run and its result
    "run_inheritune", "planned_stages", "rank_tokens", "InherituneResult", "Stage", "load_result",
    # the paper's zero-shot evaluation
    "zero_shot", "PAPER_TASKS",
]
