"""k, the first student's depth, by the stated rule (`lens_heads.growth.k_rule`) on the reference's own rank profile.

    python analyses/inheritune_k.py     # reads figures/smollm2_growth.json, writes figures/inheritune_k_rule.json

The growth loop's record holds SmolLM2's rank profile in the paper's aggregation on the loop's own rank windows (the
reference's profile, measured where every stage's rank is), and the separate profile on SOTU texts that chose the
recorded run's k. This applies the rule to both, lists the layers each flags, and says whether the recorded run
started at the k the rule gives on the reference's own profile. No model is loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lens_heads.growth.k_rule import K_RULE, choose_k
from lens_heads.plumbing.provenance import write_record
from lens_heads.plumbing.settings import from_args, option


@dataclass(frozen=True)
class KSettings:
    growth: str = option("figures/smollm2_growth.json", "the growth loop's record (analyses/inheritune.py --preset "
                         "smollm2)")
    out: str = option("figures/inheritune_k_rule.json", "where the record goes")


def main(argv=None) -> dict:
    a = from_args(KSettings, argv, description=__doc__)
    loop = json.loads(Path(a.growth).read_text())
    own = choose_k(loop["reference"]["rank"]["averaged"])
    separate = choose_k(loop["smollm2_rank"]["averaged"])
    ran = int(loop["config"]["start_layers"])
    record = {
        "what": "k by the stated rule on the reference's own rank profile (paper's aggregation), against the k the "
                "recorded growth loop started from",
        "rule": K_RULE, "source": a.growth, "model": loop["model"].get("name"),
        "own_profile": {"windows": "the growth loop's rank windows", "definition":
                        loop["reference"]["rank"]["averaged"]["definition"], **own.to_dict()},
        "separate_profile": {"windows": "SOTU texts re-tokenised by SmolLM2 (the profile that chose the recorded k)",
                             "definition": loop["smollm2_rank"]["averaged"]["definition"], **separate.to_dict()},
        "recorded_k": ran, "recorded_k_rule": loop.get("k_rule"), "rule_k_matches_recorded": own.k == ran,
    }
    write_record(Path(a.out), record)
    print(f"own profile flags {list(own.flagged)}: k = {own.k}; separate profile flags {list(separate.flagged)}: "
          f"k = {separate.k}; the recorded loop started at {ran}")
    return record


if __name__ == "__main__":
    main()
