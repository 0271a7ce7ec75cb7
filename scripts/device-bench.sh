#!/usr/bin/env bash
# The one command of a GPU device run of the GPU lab bench (bench/lab/gpu: `python -m bench.lab.gpu`).
# Run from the repo root on the device machine; extra arguments go to both bench runs. Results land
# in $OUT (fetched back by the tool):
#   results-<date>-<gpu>-torch.{json,md}   random-weight Qwen2.5-Coder-1.5B/0.5B shapes in torch fp16 on CUDA
#   results-<date>-<gpu>-ort.{json,md}     the same pair exported to ONNX fp16, specls runtime, CUDA EP
#   device-bench.log                        everything printed
# then copy them into bench/results/ and commit (see bench/README.md).
#
# Stages (whole thing sized for < 8 minutes on an H200; measured CPU dry-run numbers in bench/README.md):
#   1. install carried wheels (.whl/*.whl, and split wheels reassembled from .whl-p*/ parts)
#   2. make `specls` importable without installing it (symlink tree; the device image has no pygls, and
#      `python -m bench.lab.gpu`, run from the repo root, needs none of the CLI)
#   3. torch backend (no export, needs no extra wheel): T(N), c, predictions, real loop  [TORCH_LIMIT s]
#   4. ORT backend with the CUDA EP, reusing stage 3's checkpoints: export fp16, load, the same numbers
#      [ORT_LIMIT s]; skipped when onnxruntime there has no CUDAExecutionProvider
#
# ---------------------------------------------------------------------------------------------------
# Preparing the device run (on the developer machine, in the repo root) -- NOT done ahead of time:
#
# The image has torch 2.11+cu130, transformers 5.17, onnx, onnxscript, tokenizers and the CPU-only
# onnxruntime 1.30; the CUDA EP needs onnxruntime-gpu. onnxruntime-gpu 1.31.1 is built for CUDA 13 /
# cuDNN 9 (cu13), which the image's nvidia-* packages should provide (loaded by preload_dlls; not yet
# verified there); its other requirements (numpy, protobuf, flatbuffers, packaging) are on the image. But its wheel is
# 255.6 MB and one call carries at most 64 MiB *including the working tree*: it has to travel in parts
# over consecutive calls to one warm machine (ignored paths already there are kept between calls; a
# machine idle for 30 s is given back and the parts are lost).
#
#   echo '/.whl/' >> .git/info/exclude; echo '/.whl-p*/' >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d /tmp/ortgpu \
#       onnxruntime-gpu==1.31.1
#   git ls-files -co --exclude-standard -z | du -ch --files0-from=- | tail -1   # tree size T MiB
#   # (2026-11-29, with one copy of the bundled weights: 30.3 MB = 28.9 MiB, so T = 29: parts of
#   # 31 MiB, 255.6 MB = 243.8 MiB -> 8 parts, .whl-p00 .. .whl-p07)
#   # parts of (60 - T) MiB each, one folder per part, plus a checksum:
#   w=$(ls /tmp/ortgpu/onnxruntime_gpu-*.whl); mkdir -p /tmp/ortgpu/parts
#   split -b $((60 - T))M -d -a 2 "$w" "/tmp/ortgpu/parts/$(basename "$w").part-"
#   for p in /tmp/ortgpu/parts/*.part-*; do d=.whl-p${p##*.part-}; mkdir -p $d; cp "$p" $d/; done
#   (cd /tmp/ortgpu && sha256sum "$(basename "$w")") > .whl-p00/SHA256SUMS
#
# Device calls (the `run` tool), back to back so the machine stays warm:
#   run(command="ls -l .whl-p00", carry=[".whl-p00"], timeout_s=60)      # starts the machine
#   run(command="ls -l .whl-p01", carry=[".whl-p01"], timeout_s=60)      # ... one per part
#   run(command="bash scripts/device-bench.sh", carry=[".whl-pNN"], timeout_s=560)
# Without onnxruntime-gpu (no parts carried, or the tree too big for parts), the same last command
# still runs stage 3 on CUDA and says that stage 4 was skipped; that takes one call.
# ---------------------------------------------------------------------------------------------------
#
# Environment knobs: OUT (results dir; default /tmp/specls-bench-out), PYTHON (default python3),
# REQUIRE_CUDA=0 (CPU dry run: let both stages run on the CPU), ORT_WITHOUT_CUDA=1 (run stage 4 even
# when onnxruntime has no CUDA EP), TORCH_LIMIT / ORT_LIMIT (seconds per stage), WORK (scratch dir).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/specls-bench-out}
PY=${PYTHON:-python3}
WORK=${WORK:-/tmp/specls-bench-work}
TORCH_LIMIT=${TORCH_LIMIT:-180}
ORT_LIMIT=${ORT_LIMIT:-300}
REQUIRE_CUDA=${REQUIRE_CUDA:-1}
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/device-bench.log") 2>&1
export PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "== [$(($(date +%s) - t0))s] $*"; }

stamp "start $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null \
    || echo "no nvidia-smi"

# 1. carried wheels ------------------------------------------------------------------------------------
SITE=/tmp/specls-site
WHEELS=/tmp/specls-wheels
rm -rf "$WHEELS" && mkdir -p "$SITE" "$WHEELS"
shopt -s nullglob
for w in .whl/*.whl; do cp "$w" "$WHEELS/"; done
parts=(.whl-p*/*.part-*)
if [ ${#parts[@]} -gt 0 ]; then
    name=$(basename "${parts[0]}"); name=${name%.part-*}
    # part suffixes are zero-padded, so the glob's order is the split order
    mapfile -t sorted < <(printf '%s\n' "${parts[@]}" | awk -F'.part-' '{print $NF"\t"$0}' | sort -n | cut -f2)
    cat "${sorted[@]}" > "$WHEELS/$name"
    sums=(.whl-p*/SHA256SUMS)
    if [ ${#sums[@]} -gt 0 ] && (cd "$WHEELS" && sha256sum -c --quiet "$OLDPWD/${sums[0]}"); then
        stamp "reassembled $name from ${#parts[@]} parts (checksum ok)"
    else
        stamp "WARNING: $name from ${#parts[@]} parts fails its checksum (a part missing?): not installed"
        rm -f "$WHEELS/$name"
    fi
fi
wheels=("$WHEELS"/*.whl)
if [ ${#wheels[@]} -gt 0 ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "${wheels[@]}" && stamp "installed ${#wheels[@]} wheel(s) into $SITE"
fi
shopt -u nullglob

# 2. specls importable as installed (specls.decoder -> decoder/ ...) ---------------------------------------
SRC=/tmp/specls-src
rm -rf "$SRC" && mkdir -p "$SRC/specls"
for f in specls/*; do ln -s "$PWD/$f" "$SRC/specls/$(basename "$f")"; done
for d in lsp decoder models; do ln -s "$PWD/$d" "$SRC/specls/$d"; done
export PYTHONPATH="$SITE:$SRC${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "transformers", "onnx", "onnxscript", "onnxruntime", "tokenizers", "numpy"):
    try:
        m = importlib.import_module(name)
        print(f"  {name} {getattr(m, '__version__', '?')} ({m.__file__})")
    except Exception as exc:  # report and go on: the stage that needs it fails with its own message
        print(f"  {name}: NOT importable ({exc})")
try:
    import onnxruntime as ort
    print("  onnxruntime providers:", ort.get_available_providers())
    import torch
    print("  torch cuda:", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
except Exception as exc:
    print("  provider check failed:", exc)
EOF

cuda_flag=()
[ "$REQUIRE_CUDA" = "1" ] && cuda_flag=(--require-cuda)
rc_torch=0
rc_ort=0

# 3. torch backend -------------------------------------------------------------------------------------------
stamp "stage 3: torch backend (limit ${TORCH_LIMIT}s)"
timeout "$TORCH_LIMIT" "$PY" -m bench.lab.gpu -v --backend torch "${cuda_flag[@]}" --work "$WORK" --reuse \
    --out "$OUT" "$@" || rc_torch=$?
stamp "stage 3 exit $rc_torch"

# 4. ORT backend -------------------------------------------------------------------------------------------
if "$PY" -c "import sys, onnxruntime as o; sys.exit('CUDAExecutionProvider' not in o.get_available_providers())" \
    || [ "${ORT_WITHOUT_CUDA:-0}" = "1" ]; then
    stamp "stage 4: ORT backend (limit ${ORT_LIMIT}s)"
    timeout "$ORT_LIMIT" "$PY" -m bench.lab.gpu -v --backend ort "${cuda_flag[@]}" --work "$WORK" --reuse \
        --out "$OUT" "$@" || rc_ort=$?
    stamp "stage 4 exit $rc_ort"
else
    stamp "stage 4 skipped: onnxruntime has no CUDAExecutionProvider (carry onnxruntime-gpu: see the header)"
    rc_ort=3
fi

ls -l "$OUT"
stamp "done: torch rc=$rc_torch ort rc=$rc_ort"
[ "$rc_torch" = 0 ] || [ "$rc_ort" = 0 ]
