"""The renderer's helpers (scripts/pages) and the sentences they decide: a record that flips a verdict, a direction or
a count changes the page, and a claim's status follows its record."""

import shutil
import subprocess

import pandas as pd
import pytest

from conftest import ROOT
from lens_heads.stats import calling
from test_docs import renderer


def pages():
    r = renderer()
    return r.claims, r.imports, r.measures


def test_claim_status_follows_the_verdicts():
    claims, _, _ = pages()
    yes, no = "Inheritune better", "stacking better"
    assert claims.claim_status([yes, yes], yes) == claims.REPRODUCED
    assert claims.claim_status([yes, calling.CANNOT_TELL], yes) == claims.NOT_CALLED
    assert claims.claim_status([yes, calling.DISAGREE, calling.NOT_TESTED], yes) == claims.NOT_CALLED
    assert claims.claim_status([yes, calling.DISAGREE, no], yes) == claims.NOT_REPRODUCED
    assert claims.claim_status(["lower", "higher"], ["lower", "higher"]) == claims.REPRODUCED
    assert claims.claim_status(["lower", "lower"], ["lower", "higher"]) == claims.NOT_REPRODUCED
    assert claims.claim_status([], yes) == claims.NOT_RECORDED
    with pytest.raises(ValueError, match="one each or one for all"):
        claims.claim_status([yes, yes], [yes])


def test_untested_comparisons_are_counted_by_why():
    claims, _, _ = pages()
    nan = float("nan")
    rows = [dict(verdict=calling.NOT_TESTED, p_value=nan, low=nan, high=nan),
            dict(verdict=calling.NOT_TESTED, p_value=0.01, low=nan, high=nan),
            dict(verdict=calling.NOT_TESTED, p_value=nan, low=nan, high=nan, test_note="one curve ends short"),
            dict(verdict=calling.NOT_TESTED, p_value=nan, low=nan, high=nan),
            dict(verdict=calling.CANNOT_TELL, p_value=0.5, low=-1.0, high=1.0)]
    assert claims.untested(rows) == {"no permutation p-value": 2, "no bootstrap interval": 1,
                                     "one curve ends short": 1}


def test_units_and_lower_bounds():
    _, _, measures = pages()
    # GNU time's KiB: 3,539,236 KiB = 3,624,177,664 bytes = 3.375 GiB
    assert measures.gib_from_kib("3539236") == f"{3539236 * 1024 / 2 ** 30:.1f} GiB" == "3.4 GiB"
    assert measures.gib_from_kib(1845632) == "1.8 GiB"
    assert measures.floor_to(0.9419, 3) == "0.941"  # rounding would say 0.942, above the bound
    assert measures.floor_to(0.942, 3) == "0.942"
    assert measures.floor_to(-0.0005, 3) == "-0.001"


def _package(root, imports):
    for folder, deps in imports.items():
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
        (root / folder / "m.py").write_text("".join(f"from lens_heads.{d}.m import x\n" for d in deps))


def test_the_layer_diagram_is_read_from_the_imports(tmp_path):
    _, imports, _ = pages()
    _package(tmp_path, {"base": [], "mid": ["base"], "top": ["mid", "base"], "side": ["base"]})
    graph = imports.folder_imports(tmp_path)
    assert graph == {"base": set(), "mid": {"base"}, "top": {"mid", "base"}, "side": {"base"}}
    assert imports.layer_order(graph) == ["base", "mid", "side", "top"]
    drawn = imports.mermaid(graph).splitlines()
    assert drawn[0] == "flowchart BT"
    arrows = {line.strip() for line in drawn if "-->" in line}
    # top -> base is implied by top -> mid -> base
    assert arrows == {"top --> mid", "mid --> base", "side --> base"}
    assert imports.modules(tmp_path)["top"] == ["m"]
    (tmp_path / "base" / "m.py").write_text("from lens_heads.top.m import x\n")
    with pytest.raises(ValueError, match="cycle"):
        imports.layer_order(imports.folder_imports(tmp_path))


def test_the_architecture_page_draws_the_packages_own_imports():
    _, imports, _ = pages()
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert imports.mermaid(imports.folder_imports(ROOT / "lens_heads")) in page


def _git(cwd, *args):
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "HOME": str(cwd), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def test_commits_since_counts_only_the_measured_paths(tmp_path):
    _, _, measures = pages()
    _git(tmp_path, "init", "-q")
    (tmp_path / "code").mkdir()

    def commit(path, text):
        (tmp_path / path).write_text(text)
        _git(tmp_path, "add", path)
        _git(tmp_path, "commit", "-qm", path)
        return _git(tmp_path, "rev-parse", "HEAD")

    recorded = commit("code/a.py", "1")
    commit("page.md", "docs only")
    assert measures.commits_since(recorded, ("code",), tmp_path) == 0
    commit("code/a.py", "2")
    commit("code/a.py", "3")
    assert measures.commits_since(recorded, ("code",), tmp_path) == 2
    with pytest.raises(RuntimeError, match="cannot count"):
        measures.commits_since("0" * 40, ("code",), tmp_path)
    assert measures.commits_behind("0" * 40, ("code",), tmp_path) is None
    assert measures.commits_behind(recorded, ("code",), tmp_path) == 2


def _set(path, where: dict, **values):
    table = pd.read_csv(path, keep_default_na=False, na_values=[""])
    mask = pd.Series(True, index=table.index)
    for column, value in where.items():
        mask &= table[column].astype(str) == str(value)
    assert mask.sum() == 1, (path.name, where)
    for column, value in values.items():
        table.loc[mask, column] = value
    table.to_csv(path, index=False)


@pytest.fixture(scope="module")
def perturbed(tmp_path_factory, checkout_pages):
    """The pages rendered from the checkout and from a copy of its records with a few verdicts, a direction and a
    count changed."""
    root = tmp_path_factory.mktemp("records")
    shutil.copytree(ROOT / "docs", root / "docs", ignore=shutil.ignore_patterns("*.png"))
    shutil.copytree(ROOT / "figures", root / "figures", ignore=shutil.ignore_patterns("*.png", "*.gz"))
    f = root / "figures"
    # a share zeroable within 1 point: AHON (LN) now clearly beyond random on PIQA
    _set(f / "sweep_piqa_tests.csv", dict(a="AHON (LN)", b="random", summary="zeroable_authors"),
         difference=10.0, low=2.0, high=18.0, p_value=0.001, p_adjusted=0.001)
    # the README's first finding flips: AHON (LN) now costs more KL than random on ARC-Easy
    _set(f / "sweep_arc_easy_tests.csv", dict(a="AHON (LN)", b="random", summary="kl_auc"),
         difference=0.6, low=0.47, high=0.76, p_value=0.001, p_adjusted=0.002)
    # one untested comparison of a score against attribution gets both tests: the count of tests grows by one
    tests = pd.read_csv(f / "attribution_ranking_piqa_tests.csv")
    untested = tests[tests.p_value.isna() & (tests.b == "attribution (static)")].iloc[0]
    _set(f / "attribution_ranking_piqa_tests.csv", dict(a=untested.a, b=untested.b, summary=untested.summary),
         difference=0.1, low=0.05, high=0.15, p_value=0.001, p_adjusted=0.001)
    # scratch at twice the steps now ends above the student
    results = pd.read_csv(f / "inheritune_results.csv")
    student = float(results.loc[results.stage == "student_4L", "val_loss"].iloc[0])
    _set(f / "inheritune_results.csv", dict(stage="scratch_4L_2x"), val_loss=student + 0.5)
    return checkout_pages, renderer().render(root)


def _claim(page: str, claim: str, task: str, model: str = "SmolLM2-135M-Instruct") -> str:
    rows = [line for line in page.splitlines() if f"| {claim} |" in line and f"| {model} | {task} |" in line]
    assert len(rows) == 1, (claim, task, rows)
    return rows[0].split(" | ")[2].strip("* ")


@pytest.mark.slow  # a second rendering of every page (perturbed)
def test_a_claims_status_follows_its_record(perturbed):
    before, after = perturbed
    claim = "a share of heads is zeroable within 1 accuracy point (AHON (LN) beyond random)"
    assert _claim(before["docs/results.md"], claim, "PIQA") != "reproduced"
    assert _claim(after["docs/results.md"], claim, "PIQA") == "reproduced"
    assert _claim(after["docs/results.md"], claim, "ARC-Easy") == _claim(before["docs/results.md"], claim, "ARC-Easy")


@pytest.mark.slow  # a second rendering of every page (perturbed)
def test_a_flipped_verdict_flips_the_findings(perturbed):
    before, after = perturbed
    row = "| zeroing the heads AHON (LN) calls inactive vs as many random heads (ARC-Easy) |"

    def finding(page):
        return next(line for line in page.splitlines() if line.startswith(row))

    assert "**AHON (LN) better**" in finding(before["docs/results.md"])
    assert "**random better**" in finding(after["docs/results.md"])
    assert "0.600 [0.470, 0.760]" in finding(after["docs/results.md"])
    readme = " ".join(after["README.md"].split())
    assert "zeroing the heads AHON (LN) calls inactive (solid) costs more than zeroing at random" in readme
    assert "0.600 [0.470, 0.760], **random better** on ARC-Easy" in readme


@pytest.mark.slow  # a second rendering of every page (perturbed)
def test_a_count_of_tests_counts_tested_rows(perturbed):
    before, after = perturbed
    count = []
    for page in (before, after):
        text = " ".join(page["docs/results.md"].split()).split("**Scores against attribution, in full**: of the ", 1)[1]
        count.append((int(text.split(" ", 1)[0]), int(text.split("; ", 1)[1].split(" ", 1)[0])))
    (tested_before, untested_before), (tested_after, untested_after) = count
    assert (tested_after, untested_after) == (tested_before + 1, untested_before - 1)


@pytest.mark.slow  # a second rendering of every page (perturbed)
def test_a_direction_word_follows_its_record(perturbed):
    before, after = perturbed
    assert "scratch given twice the steps ends lower (" in before["docs/inheritune.md"]
    assert "scratch given twice the steps ends higher (" in after["docs/inheritune.md"]
    assert '"beats scratch trained 2x" is seen in this one run' in after["docs/inheritune.md"]


def test_the_page_check_leaves_out_only_the_text_that_moves_with_head(tmp_path):
    r = renderer()
    m = r.measures
    page = f"recorded at abc, {m.moves_with_head('3 commits behind HEAD')}; 677 tests\n"
    (tmp_path / "page.md").write_text(page.replace("3 commits", "5 commits"))
    assert r.differences({"page.md": page}, tmp_path) == []
    (tmp_path / "page.md").write_text(page.replace("677", "678"))
    assert len(r.differences({"page.md": page}, tmp_path)) == 1
    assert m.steady(page) == m.steady(page.replace("3 commits", "4 commits")) != m.steady(page.replace("abc", "abd"))


def test_an_optional_record_not_yet_made_is_none(tmp_path):
    (tmp_path / "docs" / "records").mkdir(parents=True)
    (tmp_path / "docs" / "records" / "made.json").write_text('{"n": 3}')
    records = renderer().Records(tmp_path)
    assert records.optional("docs/records/made.json") == {"n": 3}
    assert records.optional("docs/records/not_yet.json") is None
    with pytest.raises(FileNotFoundError, match="not_yet.json"):
        records.record("docs/records/not_yet.json")


def test_every_claim_has_one_of_the_statuses():
    claims, _, _ = pages()
    page = (ROOT / "docs" / "results.md").read_text()
    table = page.split("## What this reproduces, at a glance", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| inactive heads |")
            or line.startswith("| attention collapse |")]
    papers = {line.split(" | ")[0].strip("| ") for line in rows}
    assert papers == {"inactive heads", "attention collapse"}
    assert all(line.split(" | ")[2].strip("* ") in claims.STATUSES for line in rows), rows


def test_a_record_states_its_commit_and_its_distance_from_head():
    """``recorded`` counts the commits since the record's own (git rev-list, counted here independently) and marks
    that count as moving with HEAD, so the page check leaves it out."""
    r = renderer()
    first = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=ROOT, capture_output=True,
                           text=True).stdout.split()[0]
    since = subprocess.run(["git", "rev-list", "--count", f"{first}..HEAD"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    text = r.recorded({"provenance": {"recorded_at": "2026-12-01T00:00:00", "commit": first}})
    assert text.startswith(f"recorded 2026-12-01 at commit {first[:7]}, ")
    assert f"{since} commits behind HEAD" in text
    assert r.measures.steady(text) == f"recorded 2026-12-01 at commit {first[:7]}, <!-- moves with HEAD --><!-- /moves with HEAD -->"
    assert r.recorded({}) == "recorded before records stated their commit"


def test_every_logged_timing_states_its_commit_distance_the_same_way(tmp_path):
    """A section of the benchmark log that names its commit gets recorded()'s words, one that names none says so:
    no section is left with a date alone."""
    r = renderer()
    first = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=ROOT, capture_output=True,
                           text=True).stdout.split()[0]
    (tmp_path / "log.md").write_text(f"## A\n\n`bench` (2026-12-01; x86_64) at commit {first[:7]}\n\n"
                                     "## B\n\n`bench` (2026-12-02; x86_64)\n")
    records = r.Records(tmp_path)
    named = records.stamp("log.md", "A")
    assert named == r.recorded({"provenance": {"recorded_at": "2026-12-01", "commit": first[:7]}}).replace(
        "recorded", "measured", 1)
    assert "commits behind HEAD" in named
    assert records.stamp("log.md", "B") == ("measured 2026-12-02, at a commit the log does not name (its distance "
                                            "from HEAD is unknown)")


def test_the_readme_lists_each_claim_once_under_the_status_its_rows_give():
    claims, _, _ = pages()
    table = "\n".join([
        "| paper | claim | status here | model |", "|---|---|---|---|",
        f"| p | a | **{claims.REPRODUCED}** | m1 |", f"| p | a | **{claims.REPRODUCED}** | m2 |",
        f"| p | b | **{claims.REPRODUCED}** | m1 |", f"| p | b | **{claims.NOT_REPRODUCED}** | m2 |",
        f"| p | c | **{claims.NOT_CALLED}** | m1 |", f"| p | c | **{claims.NEEDS_GPU}** | m2 |",
        f"| p | d | **{claims.NOT_COMPLETED}** | m1 |", "| p | e | **made up** | m1 |"])
    assert claims.claim_lists(table) == {
        "reproduced": {claims.REPRODUCED: ["a"]},
        "not reproduced": {claims.NOT_REPRODUCED: ["b"]},
        "open": {claims.NOT_CALLED: ["c"], claims.NEEDS_GPU: ["c"], claims.NOT_COMPLETED: ["d"]}}
