#!/usr/bin/env bash
# Makes sure a Chromium is on PATH for the console's browser tests, which
# drive it headless. As root on Debian/Ubuntu it installs Debian's chromium
# package; otherwise it says, in one line, what to install.
set -euo pipefail

for name in chromium chromium-browser google-chrome headless-shell; do
  if command -v "$name" >/dev/null 2>&1; then
    exit 0
  fi
done
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "Chromium is missing: installing Debian's chromium package" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
  command -v chromium >/dev/null 2>&1 && exit 0
fi
echo "Chromium is missing: install it (Debian/Ubuntu: sudo apt-get install chromium) and run make test again" >&2
exit 1
