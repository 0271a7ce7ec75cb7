#!/usr/bin/env bash
# The real-editor end-to-end tests: install/build what they need (cached), then run them.
#   bash scripts/e2e.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-editors.sh
exec .venv/bin/pytest -q tests/e2e --durations=0 -rs "$@"
