"""One small report of the embedded model per test session, shared by test_report and test_report_browser.

It runs the real command line in a subprocess with the ``--quick`` sizes given as flags (so no stage is skipped:
``--quick`` itself leaves out the head effects), on ``N`` items, an example prompt that carries HTML markup, into a folder under
pytest's base temp dir; the second test module to ask finds it finished (the run is the expensive part).

For development on a busy machine, ``LENS_HEADS_TEST_REPORT_SEED=<folder of an earlier --quick report>`` copies
that folder's stage cache in first, so the command reuses its finished stages (CI leaves it unset and runs all).
"""

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MARKUP_PROMPT = "<b>bold</b><script>alert(1)</script> The capital of France is"
# A recorded sweep of another task beside the report's own: the comparison section runs too.
COMPARE_WITH = "figures/sweep_piqa.json"
N = 8  # items: half the --quick preset's, enough for every stage to act on several inputs (CI's time)
QUICK_ARGS = ["--n", str(N), "--rank-n", "8", "--fractions", "0,0.15,0.3", "--scores", "AWFT,AHON (LN)", "--prompt",
              MARKUP_PROMPT, "--no-progress", "--compare", COMPARE_WITH]


@dataclass
class Run:
    out: Path
    returncode: int
    stdout: str
    stderr: str

    @property
    def results(self) -> dict:
        return json.loads((self.out / "results.json").read_text())


def run_cli(args: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "lens_heads.report", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=Path(__file__).resolve().parents[1])


def quick_report(tmp_path_factory) -> Run:
    base = tmp_path_factory.getbasetemp() / "quick-report"
    out = base / "out"
    done = base / "run.json"
    if not done.exists():
        seed = os.environ.get("LENS_HEADS_TEST_REPORT_SEED")
        if seed:
            shutil.copytree(Path(seed) / "cache", out / "cache")
        proc = run_cli([*QUICK_ARGS, "--out", str(out)])
        base.mkdir(parents=True, exist_ok=True)
        done.write_text(json.dumps({"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}))
    d = json.loads(done.read_text())
    return Run(out=out, returncode=d["returncode"], stdout=d["stdout"], stderr=d["stderr"])
