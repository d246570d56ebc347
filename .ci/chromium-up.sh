#!/usr/bin/env bash
# Headless Chromium for the listening-page test (tests/report/test_votes_browser.py): Debian's `chromium`
# package. Idempotent: installs only when no chromium binary is on PATH. Prints the binary's
# path on stdout; exit status != 0 with the reason on stderr when it cannot be installed (the
# test then fails with that reason; it never skips silently).
#   bash .ci/chromium-up.sh
set -euo pipefail
log() { echo "chromium-up: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

find_bin() { command -v chromium || command -v chromium-browser || true; }

bin=$(find_bin)
if [ -z "$bin" ]; then
  [ "$(id -u)" = 0 ] || die "no chromium on PATH and not root: install Debian's 'chromium' package"
  command -v apt-get >/dev/null || die "no chromium on PATH and no apt-get: install chromium"
  log "installing chromium (Debian package)"
  export DEBIAN_FRONTEND=noninteractive
  # Another apt client may hold the lock for a while (concurrent installs): wait for it.
  apt-get -o DPkg::Lock::Timeout=600 update -qq >&2 || die "apt-get update failed"
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends chromium >&2 ||
    die "apt-get install chromium failed"
  bin=$(find_bin)
  [ -n "$bin" ] || die "chromium installed but not on PATH"
fi
"$bin" --version >&2 || die "$bin --version failed"
echo "$bin"
