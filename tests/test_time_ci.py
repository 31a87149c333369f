"""``benchmarks/time_ci.py`` reads the steps of ``.ci/run``: those written in its functions count too (the steps
that run side by side), so a record names every step it holds and every one it left out."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports its neighbours (timing) by name

from time_ci import ci_steps, steps  # noqa: E402


def test_steps_inside_functions_are_steps(tmp_path):
    script = tmp_path / "run"
    script.write_text("step setup bash setup.sh\nchecks() {\n  step mypy mypy  # type check\n}\n"
                      "# step not-a-step: a comment\nstepper x\n  together checks\n")
    assert ci_steps(script) == ["setup", "mypy"]


def test_the_real_script_names_each_step_once():
    names = ci_steps(ROOT / ".ci" / "run")
    assert len(names) == len(set(names)) and {"setup", "pytest", "floats", "bridge"} <= set(names)


def test_appended_lines_become_steps():
    ran = steps("floats\t113.2\t120.0\t13.0\t1.5\t1.2\n")
    assert [s["name"] for s in ran] == ["floats"] and ran[0]["wall_s"] == 113.2 and ran[0]["cpu_s"] == 133.0
