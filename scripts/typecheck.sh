#!/usr/bin/env bash
# mypy over the package as it installs: specls.lsp/decoder/models live in top-level folders mapped by
# setuptools' package-dir, which mypy cannot follow through an editable install. Build a symlink tree
# with the installed shape under build/mypy and check that.
set -euo pipefail
cd "$(dirname "$0")/.."
root=build/mypy/specls
rm -rf build/mypy && mkdir -p "$root"
for f in specls/*; do ln -s "$PWD/$f" "$root/$(basename "$f")"; done
for d in lsp decoder models; do ln -s "$PWD/$d" "$root/$d"; done
exec .venv/bin/mypy "$@"
