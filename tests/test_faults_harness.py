"""``python -m lens_heads.harness`` stopped by SIGTERM, in the middle of its evaluation and in the middle of writing
its output (after lm-eval wrote a samples file, before the results): exit 143, and no file at all, partial or not,
where the output goes (nor the hidden staging folder); an uninterrupted run puts lm-eval's files in place."""

from __future__ import annotations

import signal

import pytest

from families import build_folder
from test_faults import start_worker, wait_for


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_folder("llama-3", tmp_path_factory.mktemp("model"))


@pytest.mark.slow  # real subprocesses, each importing lm-eval and torch (seconds each)
@pytest.mark.parametrize("pause", ["evaluating", "writing"])
def test_a_stopped_run_leaves_no_output_file(folder, tmp_path, pause):
    out = tmp_path / "results"
    ready = tmp_path / "ready"
    worker = start_worker("harness_worker.py", dict(folder=str(folder), out=str(out), ready=str(ready), pause=pause),
                          tmp_path, "run")
    wait_for(ready, worker)
    if pause == "writing":  # the case under test: lm-eval has written a file, to the staging folder
        assert [p.name for p in tmp_path.glob(".results.partial-*/*/samples_*.jsonl")]
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=120)
    assert worker.returncode == 143, err[-3000:]
    assert "lm-eval run stopped by SIGTERM (exit 143): no output file was written" in err
    assert not out.exists() and not list(tmp_path.glob(".results.partial-*"))


@pytest.mark.slow
def test_a_finished_run_puts_lm_evals_files_in_place(folder, tmp_path):
    out = tmp_path / "results"
    worker = start_worker("harness_worker.py", dict(folder=str(folder), out=str(out), ready=str(tmp_path / "ready"),
                                                    pause=None), tmp_path, "run")
    _, err = worker.communicate(timeout=300)
    assert worker.returncode == 0, err[-3000:]
    files = sorted(p.name.split("_2")[0] for p in out.rglob("*") if p.is_file())  # names without lm-eval's date
    assert files == ["results", "samples_arc_easy_local"] and not list(tmp_path.glob(".results.partial-*"))
