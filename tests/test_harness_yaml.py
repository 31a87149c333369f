"""A task YAML of your own is read with PyYAML's public safe loader (no private lm-eval import): malformed YAML, in
the file named, is an InputError naming the file and the line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import lens_heads as lh
from lens_heads.harness.tasks import read_task_yaml
from lens_heads.plumbing.errors import InputError

ARC = Path(__file__).parent / "data" / "lm_eval" / "arc_easy_local.yaml"


def test_a_malformed_task_yaml_names_the_file_and_the_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: bad\ndataset_path: json\nmetric_list:\n  - metric: [acc\n    aggregation: mean\n")
    with pytest.raises(InputError, match=rf"{bad}, line 5, column \d+: not valid YAML"):
        lh.load_task(f"lm_eval:{bad}")
    with pytest.raises(InputError, match=r"holds a list, not a mapping"):
        (tmp_path / "list.yaml").write_text("- task: x\n")
        lh.load_task(f"lm_eval:{tmp_path / 'list.yaml'}")


def test_a_malformed_neighbour_does_not_stop_a_good_task(tmp_path):
    """lm-eval indexes every YAML of the folder and skips one it cannot read: the task named still loads."""
    good = shutil.copy(ARC, tmp_path / "arc.yaml")
    (tmp_path / "neighbour.yaml").write_text("task: other\nfoo: {a: 1\n")
    assert len(lh.load_task(f"lm_eval:{good}", n=2)) == 2


def test_functions_and_includes_are_read_as_data(tmp_path):
    (tmp_path / "base.yaml").write_text("dataset_path: json\ntask: from_base\nprocess_docs: !function utils.fix\n")
    (tmp_path / "leaf.yaml").write_text("include: base.yaml\ntask: leaf\n")
    config = read_task_yaml(tmp_path / "leaf.yaml")
    assert config == {"dataset_path": "json", "task": "leaf", "process_docs": "!function utils.fix"}
    (tmp_path / "loop.yaml").write_text("include: loop.yaml\ntask: loop\n")
    with pytest.raises(InputError, match="includes itself"):
        read_task_yaml(tmp_path / "loop.yaml")


def test_no_private_lm_eval_module_is_imported():
    source = (Path(lh.__file__).parent / "harness" / "tasks.py").read_text()
    assert "lm_eval.tasks._" not in source
