#!/usr/bin/env bash
# Makes sure redis-server is on PATH for the tests, which start their own
# servers on free loopback ports (they never use one already running).
# As root on Debian/Ubuntu it installs the redis-server package; otherwise it
# says, in one line, what to install.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "redis-server is missing: installing Debian's redis-server package" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  command -v redis-server >/dev/null 2>&1 && exit 0
fi
echo "redis-server is missing: install it (Debian/Ubuntu: sudo apt-get install redis-server) and run make test again" >&2
exit 1
