#!/usr/bin/env bash
# Install as users install: build the wheel, install it into a fresh venv (no torch: the export extra
# is not asked for), check the bundled models are in it, then from that venv complete demo/example.py
# with the bundled pair, list the models, and check that a conversion asks for the export extra.
# Exits non-zero on the first failed check. Needs the package index (or pip's cache) for the
# wheel's dependencies; builds with the .venv's setuptools.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
PY=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# a copy of the tree: setuptools' build/ keeps files deleted since the last build, which must not ship
tar --exclude=./.venv --exclude=./.git --exclude=./build --exclude=./dist --exclude='*.egg-info' \
    --exclude=./editors --exclude=./runs --exclude=./test-artifacts --exclude=__pycache__ -cf - . \
    | (mkdir "$work/src" && tar -xf - -C "$work/src")
.venv/bin/pip wheel -q --no-deps --no-build-isolation -w "$work/dist" "$work/src"
wheel=$(ls "$work"/dist/specls-*.whl)
echo "check-wheel: built $(basename "$wheel")"

.venv/bin/python - "$wheel" <<'EOF'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = [f"specls/models/bundled/{role}/{f}" for role in ("target", "draft")
        for f in ("specls.json", "model.onnx", "tokenizer.json")]
need += ["specls/models/hub.py", "specls/models/model_store.py", "specls/models_cmd.py"]
missing = [n for n in need if n not in names]
if missing:
    sys.exit(f"check-wheel: missing from the wheel: {missing}")
EOF

"$PY" -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$wheel"
cd "$work"  # never import the checkout's sources
if "$work/venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "check-wheel: torch is importable in the clean venv; the wheel must not need it" >&2
    exit 1
fi

out=$("$work/venv/bin/specls" complete "$repo/demo/example.py" --line 23 --character 0)
if [ -z "${out//[[:space:]]/}" ]; then
    echo "check-wheel: specls complete printed no completion" >&2
    exit 1
fi
echo "check-wheel: completion without torch: $(printf '%s' "$out" | head -c 60 | tr '\n' ' ')..."

SPECLS_CACHE="$work/cache" HF_HUB_OFFLINE=1 "$work/venv/bin/specls" models >/dev/null
printf 'GGUF' >"$work/junk.gguf"
if SPECLS_CACHE="$work/cache" "$work/venv/bin/specls" models pull "$work/junk.gguf" 2>"$work/err"; then
    echo "check-wheel: converting without the export extra succeeded?" >&2
    exit 1
fi
if ! grep -q "pip install 'specls\[export\]'" "$work/err"; then
    echo "check-wheel: a conversion without the export extra must name the install command; got:" >&2
    cat "$work/err" >&2
    exit 1
fi
echo "check-wheel: ok (wheel installs without torch, completes with the bundled pair; conversions ask for specls[export])"
