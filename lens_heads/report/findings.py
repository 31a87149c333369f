"""What the report claims, in words a reader takes in first: the findings box at the top of the page and the sweep
summary under human column names, every number with its 95% interval as ``x [lo, hi]``.

A claim that one curve beats another follows the one calling rule (:mod:`lens_heads.stats.calling`), whose words
the box uses: the findings' tests of one task are one family.
"""

from __future__ import annotations

import math

import pandas as pd

from lens_heads.heads.scores import most_inactive
from lens_heads.report import glossary
from lens_heads.report.render import Raw, Section
from lens_heads.stats import calling
from lens_heads.stats.inference import Interval
from lens_heads.viz.escape import esc

INACTIVE_SHOWN = 5

# summary() column (points = 1, share = 10) -> (page heading, number format)
HUMAN_COLUMNS = {
    "zeroable_within_1_point_pct": ("% zeroable within 1 point (authors' rule)", ".1f"),
    "zeroable_within_1_point_censored_pct": ("% zeroable within 1 point (censored rule)", ".1f"),
    "normalised_auc_pct": ("accuracy AUC (%)", ".1f"),
    "auc_rank": ("rank by accuracy AUC", ".1f"),
    "normalised_auc_kl": ("KL AUC (nats)", ".3f"),
    "kl_rank": ("rank by KL AUC", ".1f"),
    "kl_at_10pct": ("KL at 10% zeroed (nats)", ".3f"),
}


def with_interval(row: pd.Series, column: str, spec: str) -> str:
    """``x [lo, hi]`` where the row has the column's interval, else ``x``."""
    value = row[column]
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    low, high = row.get(f"{column}_low"), row.get(f"{column}_high")
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return f"{value:{spec}}"
    return Interval(float(value), float(low), float(high)).format(spec).replace(" ", "\u00a0")  # kept on one line


def summary_table(summary: pd.DataFrame) -> pd.DataFrame:
    """``SweepResult.summary(1.0, intervals=...)`` as read on the page: human headings, intervals inline."""
    out = pd.DataFrame({"score": summary["score"]})
    for column, (heading, spec) in HUMAN_COLUMNS.items():
        if column in summary:
            out[heading] = [with_interval(row, column, spec) for _, row in summary.iterrows()]
    if "ends_within_1_point" in summary:
        out["ends within 1 point of the baseline"] = ["yes" if v else "no" for v in summary["ends_within_1_point"]]
    return out


def inactive_sentence(scores_result, score: str) -> str:
    """The heads a score calls most inactive on average over the task's rows."""
    heads = most_inactive(scores_result.scores.mean(score), scores_result.scores.direction[score], INACTIVE_SHOWN)
    listed = ", ".join(f"L{layer}H{head}" for layer, head in heads)
    return (f"Most inactive heads by mean {score} on {scores_result.task.name} "
            f"({scores_result.numbers['n_inputs']} rows): {listed}.")


def ablation_sentences(r) -> list[str]:
    """Baseline, how many heads can be zeroed within 1 point, and which score is best, from one sweep."""
    t, base, tests = r.task.name, r.numbers["baseline"], r.tests
    lo, hi = base["ci95"]
    out = [f"{t}: baseline accuracy {100 * base['accuracy']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] "
           f"(n={base['n']}, chance {100 * r.numbers['chance']:.1f}%)."]
    if "best_vs_random_zeroable" in tests:
        test = tests["best_vs_random_zeroable"]
        rows = r.tables[f"ablation_summary_{t}"].set_index("score")  # the numbers of the page's table
        column = "zeroable_within_1_point_pct"
        best, rand = (with_interval(rows.loc[c], column, ".1f") for c in (test["a"], "random"))
        out.append(f"{t}: zeroing by {test['a']} keeps accuracy within 1 point of the baseline up to "
                   f"{best}% of heads (authors' rule), random zeroing {rand}%; "
                   + calling.sentence(test, "% zeroable within 1 point", ".1f"))
    for key in ("best_vs_second_kl", "best_vs_random_kl"):
        if key in tests:
            out.append(f"{t}: " + calling.sentence(tests[key], "KL AUC", lower_is_better=True))
    return out


def findings(scores: list, ablations: list, rank=None) -> Section:
    """The findings box: inactive heads, heads zeroable within 1 point, the best score and whether it is
    significantly best, lazy layers; each number with its 95% interval (bootstrap over items)."""
    lines = []
    for s in scores[:1]:
        score = "AHON (LN)" if "AHON (LN)" in s.scores.names else s.scores.names[0]
        lines.append(inactive_sentence(s, score))
    for r in ablations:
        lines += ablation_sentences(r)
    if rank is not None:
        lazy = [layer for layer, is_lazy in enumerate(rank.numbers["lazy"]) if is_lazy]
        lines.append(f"Lazy layers (every head's attention rank at most 2): "
                     f"{', '.join(map(str, lazy)) if lazy else 'none'}.")
    if not lines:
        lines.append("No stage finished that the findings rest on; see the sections below.")
    note = ("Intervals: 95% percentile bootstrap over items, paired across curves; p: paired permutation test; "
            f"the calling rule: {calling.RULE}.")
    seen: list[glossary.Term] = []
    blocks = [Raw(f'<p class="finding">{linked(line, seen)}</p>') for line in lines]
    blocks.append(Raw(f'<p class="note">{linked(note, seen)}</p>'))
    if seen:
        blocks.append(Raw(glossary_html(seen)))
    return Section("Findings", blocks, anchor="findings")


GLOSSARY_ANCHOR = "glossary-"  # an entry's id on the page: this prefix and the glossary page's anchor


def linked(text: str, seen: list[glossary.Term]) -> str:
    """``text`` as escaped HTML whose first use of each glossary term not in ``seen`` links to its entry in the
    findings box's glossary; the terms it links are added to ``seen``."""
    found = []
    for term in glossary.TERMS:
        if term in seen:
            continue
        m = term.regex.search(text)
        if m:
            found.append((m.start(), m.end(), term))
    out, at = [], 0
    for start, end, term in sorted(found, key=lambda f: (f[0], -f[1])):
        if start < at:  # inside a longer term already linked
            continue
        out.append(esc(text[at:start]))
        out.append(f'<a href="#{GLOSSARY_ANCHOR}{esc(term.anchor)}">{esc(text[start:end])}</a>')
        at = end
        seen.append(term)
    out.append(esc(text[at:]))
    return "".join(out)


def glossary_html(terms: list[glossary.Term]) -> str:
    """The findings box's own glossary (the page works offline, so it cannot link to docs/glossary.md): the
    entries of ``terms``, from :mod:`lens_heads.report.glossary`."""
    entries = "".join(f'<dt id="{GLOSSARY_ANCHOR}{esc(t.anchor)}">{esc(t.name)}</dt><dd>{esc(t.text)}</dd>'
                      for t in terms)
    return f'<details class="glossary" open><summary>Glossary</summary><dl>{entries}</dl></details>'

