"""GSM8K answers read from generated text as lm-eval 0.4.5's ``gsm8k`` task reads them: two filters, one exact match.

lm-eval's ``gsm8k`` (5-shot, worked answers ending "#### N") reads each generation through two filters:

- ``strict-match``: the first "#### N" (N: an optional minus, then digits, dots and commas);
- ``flexible-extract``: the last number-like run in the text (two or more of digits, "$", "." and ",", or a
  single digit run), wherever it stands.

A filter that finds nothing gives "[invalid]". Exact match then compares the filtered text with the reference (the
whole gold answer) after deleting, from both, commas, "$", everything up to "#### " and a final "."; case ignored.

(The chain-of-thought prompt, ``load_task("gsm8k")``, is read by :func:`lens_heads.evaluation.generate.extract_answer`.)
"""

from __future__ import annotations

import re

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
INVALID = "[invalid]"
IGNORED = (re.compile(","), re.compile(r"\$"), re.compile(r"(?s).*#### "), re.compile(r"\.$"))


def strict_match(text: str) -> str:
    """lm-eval's ``strict-match`` filter: the number of the first "#### N", or "[invalid]"."""
    found = STRICT.findall(text)
    return found[0].strip() if found else INVALID


def flexible_extract(text: str) -> str:
    """lm-eval's ``flexible-extract`` filter: the last number-like run of the text, or "[invalid]"."""
    found = FLEXIBLE.findall(text)
    if not found:
        return INVALID
    return next(group for group in found[-1] if group).strip()


FILTERS = {"strict-match": strict_match, "flexible-extract": flexible_extract}


def lm_eval_normalise(text: str) -> str:
    """What lm-eval's ``gsm8k`` exact match compares: the text without commas, "$", anything up to "#### " and a
    final ".", lower-cased."""
    for pattern in IGNORED:
        text = pattern.sub("", text)
    return text.lower()


def lm_eval_exact_match(filtered: str, reference: str) -> bool:
    """lm-eval's ``gsm8k`` exact match of a filtered generation against the whole gold answer."""
    return lm_eval_normalise(filtered) == lm_eval_normalise(reference)
