"""Every record says when, from which commit and on what machine it was made."""

import json
import shutil
import subprocess
from datetime import datetime, timezone

import pytest

from lens_heads.plumbing.provenance import SOURCE, code_commit, write_record


def test_a_record_carries_its_date_commit_versions_and_machine(tmp_path):
    before = datetime.now(timezone.utc).replace(microsecond=0)
    path = write_record(tmp_path / "r.json", {"what": "x", "n": 3})
    record = json.loads(path.read_text())
    made = record["provenance"]
    assert record["what"] == "x" and record["n"] == 3
    assert before <= datetime.fromisoformat(made["recorded_at"]) <= datetime.now(timezone.utc)
    assert made["versions"]["torch"] != "not installed" and made["machine"]["cpus"] >= 1
    git = shutil.which("git")
    if git and (SOURCE / ".git").exists():
        head = subprocess.run([git, "-C", str(SOURCE), "rev-parse", "HEAD"], capture_output=True, text=True)
        assert made["commit"] == head.stdout.strip() and isinstance(made["dirty"], bool)
    else:  # an installed copy: nothing to name
        assert made["commit"] is None
    with pytest.raises(ValueError, match="already has a 'provenance'"):
        write_record(tmp_path / "s.json", record)


def test_outside_a_git_checkout_the_commit_is_none(tmp_path):
    assert code_commit(tmp_path) == {"commit": None, "dirty": None}


def test_dirty_means_the_code_differs_not_the_outputs_a_run_writes(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "figures").mkdir()
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "figures" / "result.csv").write_text("a\n1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert code_commit(tmp_path) == {"commit": head.stdout.strip(), "dirty": False}
    (tmp_path / "figures" / "result.csv").write_text("a\n2\n")  # a recording rewrote its output
    assert code_commit(tmp_path)["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert code_commit(tmp_path)["dirty"] is True
