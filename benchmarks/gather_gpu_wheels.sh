#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.sh installs on a GPU machine that reaches no package index and already has
# Python 3.12, torch and transformers: TransformerLens and what it imports that such a machine lacks. Hugging Face
# `datasets` (and its pyarrow) is left out: benchmarks/gpu_stubs stands in for it, see its docstring.
#   bash benchmarks/gather_gpu_wheels.sh [FOLDER]      # default benchmarks/.gpu_wheels (git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-benchmarks/.gpu_wheels}
PY=${PYTHON:-python3}
LIMIT_MIB=64
# pandas 2.2.3, not the 3.x of the dev venv: its cp312 wheel imports under numpy 1.26 and 2.x alike, and the GPU
# machine's numpy is whatever its torch came with. pytz, tzdata and six are what pandas 2.2 imports.
WHEELS=(transformer-lens==3.9.0 einops==0.8.2 jaxtyping==0.3.11 wadler-lindig==0.1.8 better-abc==0.0.3
        pandas==2.2.3 python-dateutil==2.9.0.post0 six==1.17.0 pytz==2025.2 tzdata==2025.2)
mkdir -p "$DEST"
"$PY" -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$DEST" "${WHEELS[@]}"
size_kib=$(du -sk "$DEST" | cut -f1)
echo "$DEST: $(ls "$DEST"/*.whl | wc -l) wheels, $((size_kib / 1024)) MiB ($size_kib KiB)"
if [ "$size_kib" -gt $((LIMIT_MIB * 1024)) ]; then
    echo "over $LIMIT_MIB MiB: the GPU machine receives at most that with the working tree; drop a wheel" >&2
    exit 1
fi
