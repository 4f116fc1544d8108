#!/usr/bin/env bash
# Makes sure valgrind (callgrind and callgrind_control) is on PATH for the
# benchmark's instructions part and its test, which count the instructions
# Redis executes per cycle. As root on Debian/Ubuntu it installs the
# valgrind package; otherwise it says, in one line, what to install.
set -euo pipefail

if command -v valgrind >/dev/null 2>&1 && command -v callgrind_control >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "valgrind is missing: installing Debian's valgrind package" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends valgrind >/dev/null
  command -v valgrind >/dev/null 2>&1 && command -v callgrind_control >/dev/null 2>&1 && exit 0
fi
echo "valgrind is missing: install it (Debian/Ubuntu: sudo apt-get install valgrind) and run make again" >&2
exit 1
