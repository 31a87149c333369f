"""Faults of the growth loop: SIGTERM between two stages and inside a stage's training, each exit 143 naming the
folder, and the same call resumed to the records an uninterrupted run writes (the loop's wall times aside)."""

from __future__ import annotations

import json
import signal

import pytest

import lens_heads.growth.growth_loop as loop
import lens_heads.training.loop as training_loop
from lens_heads.growth.growth_loop import GrowthLoopConfig, run_growth_loop
from test_faults import sigterm_after
from test_growth_loop import llama
from test_inheritune import corpus, tiny_train_config  # noqa: F401  (corpus: the fixture)


def _without_times(record: dict) -> dict:
    return {**record, "stages": [{k: v for k, v in s.items() if k != "wall_time_s"} for s in record["stages"]]}


@pytest.mark.slow  # nine short trainings, three times
def test_sigterm_between_and_inside_stages_resumes_to_the_same_records(corpus, tmp_path, monkeypatch,  # noqa: F811
                                                                       capsys):
    reference = llama(3)
    training_loop.train(reference, corpus, tiny_train_config(steps=30, eval_every=0, checkpoint_every=30),
                        progress=False)  # a reference the 1-layer student does not match: the loop grows
    config = GrowthLoopConfig(start_layers=1, grow_by=1, max_layers=3, seeds=(0,), rank_inputs=2, rank_len=16,
                              loss_windows=2, train_config=tiny_train_config(steps=4, eval_every=2, checkpoint_every=4))
    clean = run_growth_loop(reference, corpus, config, out_dir=tmp_path / "clean", progress=False)
    assert len(clean["stages"]) >= 6  # it grew at least once: stages after the interrupted ones exist
    out = tmp_path / "run"
    # between stages: the signal comes as the third stage's training is called, before any of its steps
    with monkeypatch.context() as patch:
        patch.setattr(loop, "train", sigterm_after(2, loop.train))
        with pytest.raises(SystemExit) as stopped:
            run_growth_loop(reference, corpus, config, out_dir=out, progress=False)
    assert stopped.value.code == 143
    assert f"growth loop stopped by SIGTERM (exit 143): every finished unit is kept in {out}" in capsys.readouterr().err
    assert [s["name"] for s in json.loads((out / "growth_loop.json").read_text())["stages"]] == [
        "student_1L", "random_1L"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    # inside a stage: the signal comes during the third stage's second step; the step ends, is checkpointed, stops
    with monkeypatch.context() as patch:
        patch.setattr(training_loop, "_train_step", sigterm_after(1, training_loop._train_step))
        with pytest.raises(SystemExit) as stopped:
            run_growth_loop(reference, corpus, config, out_dir=out, progress=False)
    assert stopped.value.code == 143
    checkpoints = sorted(p.name for p in (out / "seed_0" / "same_flops_1L" / "checkpoints").iterdir())
    assert checkpoints == ["step_0000002"] and not (out / "seed_0" / "same_flops_1L" / "final").exists()
    assert len(json.loads((out / "growth_loop.json").read_text())["stages"]) == 2
    resumed = run_growth_loop(reference, corpus, config, out_dir=out, progress=False)
    assert _without_times(resumed) == _without_times(clean)
    assert not list(out.rglob("*.tmp"))  # nothing partial left by the atomic writes
