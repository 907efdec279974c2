#!/usr/bin/env bash
# Installs Debian's headless-capable chromium for the viewer's browser test (idempotent; a no-op when present).
# The browser comes from the distribution's package manager, never from a tool's own download (no
# `playwright install`). Prints the browser's path on success.
set -euo pipefail
find_browser() { command -v chromium || command -v chromium-browser || true; }
BROWSER=$(find_browser)
if [ -z "$BROWSER" ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q >/dev/null
  $SUDO apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >/dev/null
  BROWSER=$(find_browser)
fi
[ -n "$BROWSER" ] || { echo "install_browser.sh: chromium was not installed" >&2; exit 1; }
echo "$BROWSER"
