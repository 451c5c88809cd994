#!/usr/bin/env bash
# The torch backend on a CUDA GPU: dequantizers bit-exact there, the demo target in f32 against the numba runtime,
# then the demo pair and the largest pair available (--target T.gguf --draft D.gguf, else the largest fixture
# pair) in the compute dtype: speculative and target-only tok/s, the speedup, tau. Exits 1 with one line when
# no CUDA device is present. Arguments go to scripts/bench/device_check.py (--device, --dtype, --json, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
exec "$PYTHON" -m scripts.bench.device_check "$@"
