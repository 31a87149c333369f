"""The words the pages, notebooks and report use, each defined once: ``docs/glossary.md`` is rendered from
:data:`TERMS`, and the report's own glossary (it is one offline file) shows the same entries.

A term's ``pattern`` is how a page names it (a regular expression): the docs tests find a term's first use on a page
by it and check that the use links to the term's entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lens_heads.collapse.rank_settings import RankSettings
from lens_heads.stats import calling

_RANK = RankSettings()


@dataclass(frozen=True)
class Term:
    """One glossary entry: its name, how pages name it (``pattern``, default: the name as a word) and its one- or
    two-line definition (plain text; backticks mark code)."""

    name: str
    text: str
    pattern: str = ""

    @property
    def anchor(self) -> str:
        """The entry's anchor on a Markdown page (GitHub's slug of its heading)."""
        return slug(self.name)

    @property
    def regex(self) -> re.Pattern[str]:
        """``pattern`` with each space matching any run of white space (a wrapped line breaks anywhere)."""
        pattern = self.pattern or rf"(?<![\w-]){re.escape(self.name)}(?![\w-])"
        return re.compile(pattern.replace("\\ ", " ").replace(" ", r"\s+"))


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but hyphens and underscores dropped, spaces to
    hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _score(name: str, formula: str, side: str) -> Term:
    return Term(name, f"{formula}. A head is inactive when the score is {side} its threshold.",
                rf"(?<![\w-]){re.escape(name)}(?! \(LN\))(?![\w-])")


def _ln(name: str, by: str = "") -> Term:
    base = name.removesuffix(" (LN)")
    by = by or f"the mean {base} of the layer's heads on the same input"
    return Term(name, f"{base} of the head divided by {by}, so a head is compared with its own layer (layer-"
                      f"normalised, the paper's (LN) variant). Inactive on the same side as {base}.",
                rf"(?<![\w-]){re.escape(name)}")


TERMS: tuple[Term, ...] = (
    _score("AWFT", "Average Weight on the First Token: the attention weight each query puts on the first token, "
                   "averaged over the queries; a head that sends its attention to the first token (an attention sink) "
                   "writes little of the rest", "above"),
    _score("AEQD", "Average Entropy of the Query Distribution: the entropy of each query's attention, averaged over "
                   "the queries; low means the head attends to one or a few keys", "below"),
    _score("FTVVN", "First Token Value Vector Norm: the length of the first token's value vector; a sink head with a "
                    "small value there writes nearly nothing", "below"),
    _score("AVVN", "Average Value Vector Norm: the length of the value vectors, averaged over the positions",
           "below"),
    _score("LTHON", "Last Token Head Output Norm: the length of the head's output (before the output projection) at "
                    "the last token", "below"),
    _score("AHON", "Average Head Output Norm: the length of the head's output (before the output projection), "
                   "averaged over the positions", "below"),
    _ln("AWFT (LN)"), _ln("AEQD (LN)"), _ln("FTVVN (LN)"), _ln("AVVN (LN)"),
    _ln("LTHON (LN)", "the layer's mean AHON (the paper's exception)"), _ln("AHON (LN)"),
    Term("per-input zeroing", "The paper's ablation: on each input, every head whose score on that input is on the "
         "inactive side of a threshold is zeroed (its output set to 0 on `hook_z`); thresholds are set so that a "
         "chosen share of all (input, head) pairs is zeroed.", r"(?i)per-input zeroing"),
    Term("static zeroing", "One fixed set of heads zeroed on every input (the heads with the most inactive mean "
         "score, or a list); what a pruned model can bake into its weights.", r"(?i)static zeroing"),
    Term("random baseline", "Zeroing as many heads at random as a score zeroes. Drawn two ways: once per item (every "
         "row of a multiple-choice item shares the draw, the default) or once per row (as the authors' code does).",
         r"(?i)random baseline|random zeroing"),
    Term("KL AUC", "The area under the curve of KL(unablated || ablated) of the next-token distributions against the "
         "share of heads zeroed, normalised by the share range: lower means zeroing those heads changes the model "
         "less."),
    Term("accuracy AUC", "The area under the curve of accuracy against the share of heads zeroed, normalised by the "
         "share range (normalised AUC): higher means accuracy survives more zeroing.", r"(?i)accuracy AUC"),
    Term("% zeroable within 1 point", "Table 2's number, by the authors' rule: the share of heads zeroed where the "
         "accuracy curve last crosses 1 point below the unablated baseline (interpolated; 0 if it never does).", r"% (of heads )?zeroable within 1 (accuracy )?point"),
    Term("censored rule", "Another reading of % zeroable within 1 point: where a curve never drops 1 point below the "
         "baseline, it gives the largest share measured (a lower bound, shown as ≥ X%) where the authors' rule gives 0.",
         r"(?i)censored rule"),
    Term("bits per byte", "The gold answer's negative log-likelihood in bits, divided by its length in UTF-8 bytes: a "
         "cost that moves even when the model never answers right (GSM8K here).", r"(?i)bits per byte"),
    Term("oracle", "Heads zeroed in the order of their measured single-head ablation KL: the ranking the scores would "
         "give if they knew each head's effect.", r"(?i)\boracle\b"),
    Term("gold log-prob change", "The paired change, item by item, of the log-probability the model gives the right "
         "answer when heads are zeroed: a finer measure than accuracy on few items.", r"(?i)gold log-prob change"),
    Term("head effect", "What zeroing one head alone does (its single-head ablation KL or gold log-prob change), "
         "measured per head: the ground truth the scores are checked against.", r"(?i)head effects?"),
    Term("approximate rank", f"The number of singular values of a head's attention matrix that hold "
         f"{100 * _RANK.energy:.0f}% of its spectral energy; a layer's rank is the most over its heads.", r"(?i)approximate rank|attention rank"),
    Term("lazy layer", f"A layer whose heads' approximate ranks are all at most {_RANK.lazy_rank:g}: its attention "
         "has collapsed to (near) rank one.", r"(?i)lazy (layer|block)s?"),
    Term("rank aggregation", "How ranks over many inputs are combined. The paper's: the rank of the input-averaged "
         "attention matrix (`aggregation=\"matrix\"`). Per input: each input's rank, then the mean over inputs "
         "(`\"rank\"`, or `\"layer_rank\"` taking the layer's max per input first, as the paper's figures do). The "
         "two can flag different layers.", r"(?i)(rank )?aggregations?"),
    Term("Block Influence", "ShortGPT's layer score: 1 − cosine similarity of the residual stream before and after a "
         "block (or its attention alone); low means the layer changes little."),
    Term("attribution patching", "A first-order estimate of every head's zeroing effect from one forward and one "
         "backward pass (the gradient times the change), instead of one ablation per head.",
         r"(?i)attribution patching|attribution \(static\)"),
    Term("calling rule", f"The one rule by which a difference is claimed: {calling.RULE}. Four verdicts: 'A "
         f"better' (or higher/lower, where neither side is better), '{calling.DISAGREE}', '{calling.CANNOT_TELL}' "
         f"and '{calling.NOT_TESTED}' (no p-value or interval).", r"(?i)calling rule|by the rule"),
    Term("Inheritune", "Build a small model by copying the first k layers of a trained reference (where attention has "
         "not collapsed) and training it further."),
    Term("growth", "Inheritune's loop: while the student is worse than its reference, add layers and train again. The "
         "default grows the trained student by the reference's next blocks.", r"(?i)\bgrowth\b"),
    Term("healing", "Training a model briefly after removing layers or heads, so that the rest adapts.",
         r"(?i)\bheal(ing|ed)?\b"),
    Term("baselines", "The Inheritune paper's comparisons: same-size scratch (random init, same or twice the steps), "
         "stacking (the student's blocks copied to double depth), hybrid stacking and the half-width start (lens_heads' "
         "own definitions), logit distillation and DistilBERT-style distillation from the reference.",
         r"(?i)\bbaselines\b"),
    Term("useful FLOPs", "The multiply-adds (2 FLOPs each) a forward needs, counted from the model's config: the "
         "blocks' products per token, attention over the keys each position sees, and the unembedding at the "
         "positions whose logits are computed; padding, norms and softmax left out (lens_heads.evaluation.flops).",
         r"(?i)useful FLOPs"),
    Term("shared prefixes", "Rows that begin alike (an item's context across its choices, a subject's shots across "
         "its questions) run that beginning once; each row's rest attends to its keys and values, its positions "
         "continuing the prefix's. Exact where every hook acts alike on every row (lens_heads.evaluation.prefix).",
         r"(?i)shared prefix(es)?"),
    Term("weight basis", "Whether TransformerLens's weight processing (fold_ln, centring, folded value biases) was "
         "applied. It leaves logits unchanged but moves the value and output norms the scores read; lens_heads keeps "
         "the raw basis by default.", r"(?i)weight basis"),
)

BY_NAME = {t.name: t for t in TERMS}

# the glossary page's sections, in order: heading -> the names of its terms
GROUPS: dict[str, tuple[str, ...]] = {
    "Head scores": tuple(t.name for t in TERMS[:12]),
    "Zeroing heads and what it costs": ("per-input zeroing", "static zeroing", "random baseline", "KL AUC",
                                        "accuracy AUC", "% zeroable within 1 point", "censored rule",
                                        "gold log-prob change", "bits per byte", "oracle",
                                        "head effect", "attribution patching"),
    "Layers and attention rank": ("approximate rank", "lazy layer", "rank aggregation", "Block Influence"),
    "Statistics": ("calling rule",),
    "Smaller models": ("Inheritune", "growth", "baselines", "healing"),
    "Models": ("weight basis",),
    "Speed": ("useful FLOPs", "shared prefixes"),
}


def term(name: str) -> Term:
    """The entry called ``name``."""
    if name not in BY_NAME:
        raise KeyError(f"no glossary term {name!r}: choose one of {', '.join(BY_NAME)}")
    return BY_NAME[name]
