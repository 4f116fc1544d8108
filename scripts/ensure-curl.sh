#!/usr/bin/env bash
# Makes sure curl is on PATH for the README's curl walkthrough of the
# HTTP/JSON API, which the tests run as written. As root on Debian/Ubuntu it
# installs the curl package; otherwise it says, in one line, what to install.
set -euo pipefail

if command -v curl >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "curl is missing: installing Debian's curl package" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends curl ca-certificates >/dev/null
  command -v curl >/dev/null 2>&1 && exit 0
fi
echo "curl is missing: install it (Debian/Ubuntu: sudo apt-get install curl) and run make test again" >&2
exit 1
