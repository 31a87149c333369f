"""A newcomer's reading of the pages: the README's sections keep to their word budgets in their order, prose is wrapped
at 120 columns, each glossary term's first use on the README and the findings page links to its entry, and every
link between pages lands on a heading that exists."""

import re

import pytest

from conftest import ROOT
from lens_heads.heads.scores import DIRECTION
from lens_heads.report.glossary import GROUPS, TERMS, slug
from test_docs import renderer

# README section (its heading; "" is the text before the first) -> the most words it may hold
BUDGETS = {"": 200, "What it found": 330, "Which of the papers' claims it reproduces": 330,
           "Set-up and the two commands": 150, "Quick tour": 130, "With lm-evaluation-harness": 90}
README_WORDS = 1000  # above "Where to go next"
TOUR_LINES = 15


def sections(page: str) -> dict[str, str]:
    """A page's text by its ``## `` headings, in order ("" for the text before the first)."""
    parts = re.split(r"^## (.+)$", page, flags=re.M)
    return {"": parts[0], **{h.strip(): body for h, body in zip(parts[1::2], parts[2::2])}}


def over_budget(page: str) -> list[str]:
    """What of the README breaks its budgets: a section past its words, the sections out of order or missing, the
    total above "Where to go next", a quick tour longer than its lines."""
    found = sections(page)
    problems = [f"{h!r}: {len(found[h].split())} words > {n}" for h, n in BUDGETS.items()
                if h in found and len(found[h].split()) > n]
    order = [h for h in found if h in BUDGETS or h == "Where to go next"]
    if order != [*BUDGETS, "Where to go next"]:
        problems.append(f"sections {order}, expected {[*BUDGETS, 'Where to go next']}")
    above = page.split("\n## Where to go next", 1)[0]
    if len(above.split()) > README_WORDS:
        problems.append(f"{len(above.split())} words above 'Where to go next' > {README_WORDS}")
    tour = found.get("Quick tour", "").split("```python\n", 1)[-1].split("```", 1)[0].strip("\n").splitlines()
    if len(tour) > TOUR_LINES:
        problems.append(f"quick tour of {len(tour)} lines > {TOUR_LINES}")
    return problems


@pytest.fixture(scope="module")
def pages(checkout_pages):
    return checkout_pages


def test_the_readme_keeps_its_budgets(pages):
    assert over_budget(pages["README.md"]) == []


def test_the_findings_page_keeps_to_3000_words(pages):
    assert len(pages["docs/results.md"].split()) <= 3000


def test_a_section_past_its_budget_fails():
    page = (ROOT / "README.md").read_text()
    grown = page.replace("## Quick tour\n", "## Quick tour\n\n" + "word " * BUDGETS["Quick tour"] + "\n", 1)
    assert any(p.startswith("'Quick tour'") for p in over_budget(grown))
    assert any("above 'Where to go next'" in p for p in over_budget(page.replace("## What it found\n", "## What it found\n" + "w " * 900, 1)))
    swapped = page.replace("## Quick tour", "## Tour", 1)
    assert any(p.startswith("sections") for p in over_budget(swapped))


WRAPPED = ["README.md", "docs/results.md", "docs/glossary.md", "docs/usage.md"]


@pytest.mark.parametrize("page", WRAPPED)
def test_prose_is_wrapped_at_120_columns(pages, page):
    fenced, long = False, []
    # text that moves with HEAD (a commit count) is wrapped as one short word, so that the lines around it stay put
    steady = renderer().measures.steady(pages[page])
    for line in re.sub(r"<!--.*?-->", "", steady).split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        # tables and images are exempt; a single word longer than the width (a URL) cannot wrap
        if not fenced and not line.startswith(("|", "![")) and len(line) > 120 and " " in line.strip():
            long.append(line)
    assert long == []


def _terms():
    return renderer().terms


@pytest.mark.parametrize("page, glossary", [("README.md", "docs/glossary.md"), ("docs/results.md", "glossary.md")])
def test_each_terms_first_use_links_to_the_glossary(pages, page, glossary):
    missing = _terms().unlinked(pages[page], glossary)
    assert missing == [], "\n".join(f"{u.term}: ...{u.context}..." for u in missing)


def test_an_unlinked_first_use_fails():
    terms = _terms()
    linked = "The [KL AUC](glossary.md#kl-auc) is low; the KL AUC again."
    assert [u.term for u in terms.unlinked(linked)] == []
    assert [u.term for u in terms.unlinked("The KL AUC is low; the [KL AUC](glossary.md#kl-auc).")] == ["KL AUC"]
    # a link to the wrong entry, a use in code and a use in a heading
    assert [u.term for u in terms.unlinked("See [KL AUC](glossary.md#accuracy-auc).")] == ["KL AUC"]
    assert terms.unlinked("`KL AUC`\n# KL AUC\n") == []
    # AHON is not its (LN) variant
    assert [u.term for u in terms.unlinked("[AHON (LN)](glossary.md#ahon-ln) and AHON")] == ["AHON"]
    # a line break inside the term is still the term
    assert [u.term for u in terms.unlinked("the KL\nAUC")] == ["KL AUC"]


def test_the_glossary_covers_the_scores_and_states_their_inactive_side(pages):
    names = {t.name: t for t in TERMS}
    assert set(DIRECTION) <= set(names)
    for score, side in DIRECTION.items():
        base = score.removesuffix(" (LN)")
        if base == score:
            assert f"inactive when the score is {'above' if side == '>' else 'below'}" in names[score].text.lower()
        else:  # the variant says it is inactive on its base's side: the code's directions agree
            assert f"same side as {base}" in names[score].text and DIRECTION[base] == side
    assert sorted(n for g in GROUPS.values() for n in g) == sorted(names)
    page = pages["docs/glossary.md"]
    for t in TERMS:
        assert f"### {t.name}\n" in page
    # GitHub's slugs, written out
    assert [names[n].anchor for n in ("AHON (LN)", "% zeroable within 1 point", "KL AUC")] == \
        ["ahon-ln", "-zeroable-within-1-point", "kl-auc"]


def _anchors(text: str) -> set[str]:
    out, fenced = set(), False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            out.add(slug(re.sub(r"^#+ ", "", line)))
    return out


def test_every_link_between_pages_lands_on_a_heading(pages):
    import posixpath

    anchors = {page: _anchors(text) for page, text in pages.items()}
    broken = []
    for page, text in pages.items():
        for target, anchor in re.findall(r"\]\(([\w./-]*?\.md|)#([\w-]+)\)", text):
            where = posixpath.normpath(posixpath.join(posixpath.dirname(page), target)) if target else page
            if where in anchors and anchor not in anchors[where]:
                broken.append(f"{page} -> {where}#{anchor}")
    assert broken == []


def test_the_report_findings_box_links_first_uses_to_its_own_glossary():
    from lens_heads.report.findings import glossary_html, linked

    seen = []
    first = linked("AHON (LN) costs less than random by KL AUC <b>", seen)
    again = linked("by KL AUC and AHON (LN) again; AHON alone", seen)
    assert first == ('<a href="#glossary-ahon-ln">AHON (LN)</a> costs less than random by '
                     '<a href="#glossary-kl-auc">KL AUC</a> &lt;b&gt;')
    assert again == 'by KL AUC and AHON (LN) again; <a href="#glossary-ahon">AHON</a> alone'
    box = glossary_html(seen)
    ids = re.findall(r'<dt id="([^"]+)">', box)
    assert ids == ["glossary-ahon-ln", "glossary-kl-auc", "glossary-ahon"]
    kl = next(t for t in TERMS if t.name == "KL AUC")
    assert kl.text.replace("||", "") in box.replace("||", "")
