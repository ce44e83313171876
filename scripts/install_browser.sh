#!/usr/bin/env bash
# Installs a headless browser for the HTML report tests (tests/report/test_browser.py).
# Why: the report must be proven to open without JavaScript errors in a real browser.
# Idempotent: does nothing when chromium is already on PATH.
set -euo pipefail
for b in chromium chromium-browser; do
    if command -v "$b" >/dev/null 2>&1; then
        echo "install_browser: $b already installed ($(command -v "$b"))"
        exit 0
    fi
done
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "install_browser: need root or sudo to apt-get install chromium" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends chromium fonts-dejavu-core
command -v chromium
