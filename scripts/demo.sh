#!/usr/bin/env bash
# Fresh machine → virtual environment with ggtools → `ggtools demo` on the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GGTOOLS_VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
. "$VENV/bin/activate"
pip install -q -e .
ggtools demo "$@"
