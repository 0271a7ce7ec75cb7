#!/usr/bin/env bash
# Create .venv and install specls with everything the demo and the tests need. Idempotent: a second
# run only reinstalls when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.specls-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    # torch first, pinned: on this kind of machine that pin is a local CPU wheel; anything else pulls
    # a multi-GB CUDA build.
    .venv/bin/pip install -q "torch==2.13.0"
    .venv/bin/pip install -q -e ".[export,dev]"
    touch "$stamp"
fi
