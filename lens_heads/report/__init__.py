"""``python -m lens_heads.report [MODEL]``: one command, one self-contained report folder.

From Python: ``build_report(ReportConfig(model="smollm2-135m", quick=True))``; see ``python -m lens_heads.report
--help`` for what each setting does.
"""

from lens_heads.report.config import ReportConfig
from lens_heads.report.pipeline import build_report

__all__ = ["ReportConfig", "build_report"]
