#!/usr/bin/env bash
# Makes sure jq is on PATH for the README's grpcurl walkthrough, which the
# tests run as written (its Complete reads the fencing token of Reserve's
# answer with jq). As root on Debian/Ubuntu it installs the jq package;
# otherwise it says, in one line, what to install.
set -euo pipefail

if command -v jq >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "jq is missing: installing Debian's jq package" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends jq >/dev/null
  command -v jq >/dev/null 2>&1 && exit 0
fi
echo "jq is missing: install it (Debian/Ubuntu: sudo apt-get install jq) and run make test again" >&2
exit 1
