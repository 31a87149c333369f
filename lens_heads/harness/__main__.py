"""``python -m lens_heads.harness ARGS``: lm-eval's command line (``lm_eval ARGS``) with the ``lens_heads`` model
registered, for lm-eval releases that don't discover it through the ``lm_eval.models`` entry point; e.g.
``python -m lens_heads.harness --model lens_heads --model_args ablation=threshold:AHON (LN):0.1 --tasks arc_easy``."""

from lm_eval.__main__ import cli_evaluate

import lens_heads.harness.lm  # noqa: F401  (registers the lens_heads model with lm-eval)


def main() -> None:
    cli_evaluate()


if __name__ == "__main__":
    main()
