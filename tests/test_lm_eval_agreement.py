"""analyses/lm_eval_agreement.py without lm-eval: the message when it is missing, and the comparison it reports."""

import sys

import pytest

from conftest import load_script
from lens_heads.data.items import Item, Task


def test_missing_lm_eval_exits_saying_how_to_install_it(monkeypatch, tmp_path):
    # import lm_eval (and any of its modules another test imported already) raises ImportError
    for name in ["lm_eval", *(m for m in sys.modules if m.startswith("lm_eval."))]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(SystemExit) as exit_:
        load_script("lm_eval_agreement").main(["--out", str(tmp_path / "never.json")])
    assert "pip install" in str(exit_.value) and "--target" in str(exit_.value) and "PYTHONPATH" in str(exit_.value) and \
        "[harness]" in str(exit_.value)
    assert not (tmp_path / "never.json").exists()


def test_comparison_counts_disagreements_and_the_largest_difference():
    items = [Item(id=f"t/{i}", contexts=("q",) * 2, continuations=(" a", " b"), gold=0) for i in range(3)]
    task = Task(name="t", split="test", shots=0, format="cloze", items=items, n_total=3, seed=0)
    ours = [[-1.0, -2.0], [-3.0, -2.5], [-1.0, -1.0004]]
    theirs = [[-1.0, -2.0002], [-2.4, -2.5], [-1.0005, -1.0]]  # item 1 flips; in item 2, 5e-4 flips a near-tie
    result = load_script("lm_eval_agreement").compare(task, ours, theirs)
    assert result["predictions_equal"] == 1 and result["disagreeing"] == ["t/1", "t/2"]
    assert result["max_abs_logprob_diff"] == pytest.approx(0.6) and result["worst_item"] == "t/1"
    assert not result["within_target"]
    assert (result["accuracy_lens_heads"], result["accuracy_lm_eval"]) == (pytest.approx(2 / 3), pytest.approx(2 / 3))
