#!/usr/bin/env bash
# On the GPU machine (no package index): install the wheels gathered by gather_gpu_wheels.sh into a scratch folder,
# then run gpu_check.py with them, the working tree and, where `datasets` is missing, its stand-in on the path.
#   bash benchmarks/gpu_check.sh OUT_FOLDER [gpu_check.py flags]      (GPU_WHEELS, GPU_SITE, PYTHON: overrides)
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${GPU_WHEELS:-benchmarks/.gpu_wheels} SITE=${GPU_SITE:-/tmp/lens_heads_gpu_site} PY=${PYTHON:-python3}
"$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --upgrade --target "$SITE" "$WHEELS"/*.whl
STUBS=$("$PY" -c "import datasets" 2>/dev/null || echo ":$PWD/benchmarks/gpu_stubs")
PYTHONPATH="$SITE:$PWD$STUBS${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" benchmarks/gpu_check.py "$@"
