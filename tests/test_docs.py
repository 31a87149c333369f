"""The docs are rendered, not typed: README.md, docs/*.md and figures/README.md equal what scripts/render_docs.py renders from the
templates in docs/src/ and the recorded files, a number edited by hand in a page fails the check, and a changed
record changes the page."""

import importlib.util
import json
import shutil

import pytest

from conftest import ROOT


def renderer():
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / "scripts" / "render_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def arc_baseline_text(record: dict) -> str:
    """The ARC-Easy sweep's baseline as the heads page shows it, written out here from the record."""
    b = record["baseline"]
    return f"{100 * b['accuracy']:.1f}% [{100 * b['ci95'][0]:.1f}, {100 * b['ci95'][1]:.1f}]"


def test_committed_pages_are_their_rendering(checkout_pages):
    diffs = renderer().differences(dict(checkout_pages))
    assert not diffs, "edit docs/src/ and run python scripts/render_docs.py:\n" + "\n".join(diffs)


def test_a_number_edited_by_hand_fails_the_check(tmp_path, checkout_pages):
    r = renderer()
    rendered = dict(checkout_pages)
    shown = arc_baseline_text(json.loads((ROOT / "figures" / "sweep_arc_easy.json").read_text()))
    for page in rendered:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    page = (tmp_path / "docs" / "heads.md").read_text()
    assert shown in page
    assert not r.differences(rendered, tmp_path)
    (tmp_path / "docs" / "heads.md").write_text(page.replace(shown, shown.replace("[", "[1", 1), 1))
    diffs = r.differences(rendered, tmp_path)
    assert len(diffs) == 1 and "docs/heads.md" in diffs[0] and shown in diffs[0]


@pytest.mark.slow  # a second rendering of every page
def test_a_changed_record_changes_the_page(tmp_path):
    shutil.copytree(ROOT / "docs", tmp_path / "docs", ignore=shutil.ignore_patterns("*.png"))
    shutil.copytree(ROOT / "figures", tmp_path / "figures", ignore=shutil.ignore_patterns("*.png"))
    path = tmp_path / "figures" / "sweep_arc_easy.json"
    record = json.loads(path.read_text())
    before = arc_baseline_text(record)
    record["baseline"]["accuracy"] = 0.4321
    path.write_text(json.dumps(record))
    page = renderer().render(tmp_path)["docs/heads.md"]
    assert arc_baseline_text(record) in page and before != arc_baseline_text(record)


def test_the_report_options_in_the_docs_are_its_help(capsys, monkeypatch):
    from lens_heads.report.__main__ import main

    monkeypatch.setenv("COLUMNS", str(renderer().HELP_WIDTH))
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    printed = capsys.readouterr().out.rstrip()
    page = (ROOT / "docs" / "report.md").read_text()
    shown = page.split("## Options", 1)[1].split("```\n", 1)[1].split("\n```", 1)[0]
    assert shown == printed


def test_the_provenance_helpers_list_what_the_records_lack(tmp_path):
    import gzip

    from lens_heads.evaluation.evaluate import ACC_NORM

    figures = tmp_path / "figures"
    figures.mkdir()
    (figures / "dated.json").write_text(json.dumps({"provenance": {"commit": "abc"}}))
    (figures / "old.json").write_text(json.dumps({"n": 3}))
    earlier = "per_char: counting the continuation's leading space"

    def units(name, metas):
        with gzip.open(figures / f"{name}_units.json.gz", "wt") as f:
            json.dump({"units": [{"result": {"meta": {} if m is None else {"acc_norm": m}}} for m in metas]}, f)

    units("current", [ACC_NORM, ACC_NORM])
    units("mixed", [earlier, ACC_NORM, None])
    units("before", [earlier])
    r = renderer()
    records = r.Records(tmp_path)
    assert records.undated() == ["old.json"]
    made = {"recorded_at": "2026-12-05T01:05:33+00:00", "commit": "1a27b4bc0ffee"}
    # the distance from HEAD moves with HEAD (tests/test_docs_render.py counts it): the page check leaves it out
    assert r.measures.steady(r.recorded({"provenance": made})) == \
        "recorded 2026-12-05 at commit 1a27b4b, <!-- moves with HEAD --><!-- /moves with HEAD -->"
    assert r.recorded({"n": 3}) == "recorded before records stated their commit"
    assert records.earlier_acc_norm() == [dict(name="before", earlier=1, units=1), dict(name="mixed", earlier=2, units=3)]


def test_stale_verdicts_are_the_tables_the_rule_now_calls_otherwise(tmp_path):
    figures = tmp_path / "figures"
    figures.mkdir()
    header = "a,b,difference,low,high,p_value,p_adjusted,verdict\n"
    # interval excludes 0 but adjusted p = 0.2: the rule says the two tests disagree, not "x better"
    (figures / "old_tests.csv").write_text(header + "x,y,0.5,0.1,0.9,0.01,0.2,x better\n")
    (figures / "new_tests.csv").write_text(header + "x,y,0.5,0.1,0.9,0.01,0.2,the two tests disagree\n"
                                           "x,y,0.5,0.1,0.9,0.01,0.01,x better\n")
    (figures / "plain.csv").write_text("a,verdict\nx,whatever\n")
    assert renderer().Records(tmp_path).stale_verdicts() == ["old_tests.csv"]
