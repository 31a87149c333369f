"""lens_heads inside lm-evaluation-harness (the ``lens_heads[harness]`` extra): the ``lens_heads`` model type
(:class:`LensHeadsLM`, registered with lm-eval on import) and lm-eval's tasks as lens_heads tasks
(``lh.load_task("lm_eval:<task>")``, :mod:`lens_heads.harness.tasks`). Nothing below this package imports lm-eval."""

from lens_heads.harness.lm import LensHeadsLM

__all__ = ["LensHeadsLM"]
