#!/usr/bin/env bash
# Makes sure node and npm are on PATH, for the Node example that `make test`
# runs (examples/node). As root on Debian/Ubuntu it installs Debian's nodejs
# and npm; otherwise it says, in one line, what to install.
set -euo pipefail

ok() { command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; }

if ok; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "node or npm is missing: installing Debian's nodejs and npm packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  log=$(mktemp)
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends nodejs npm; } >"$log" 2>&1 || cat "$log" >&2
  rm -f "$log"
  ok && exit 0
fi
echo "node and npm are missing: install Node.js 18 or later (Debian/Ubuntu: sudo apt-get install nodejs npm) and run make test again" >&2
exit 1
