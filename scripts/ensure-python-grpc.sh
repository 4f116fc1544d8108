#!/usr/bin/env bash
# Makes sure the system Python (/usr/bin/python3, not a pyenv or venv python3
# that may come first on PATH) can import grpc and google.protobuf, for the
# Python example that `make test` runs (examples/python, stubs in gen/python).
# As root on Debian/Ubuntu it installs python3-grpcio and python3-protobuf;
# otherwise it says, in one line, what to install.
set -euo pipefail

ok() { [ -x /usr/bin/python3 ] && /usr/bin/python3 -s -c 'import grpc, google.protobuf' >/dev/null 2>&1; }

if ok; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "/usr/bin/python3 cannot import grpc: installing Debian's python3-grpcio and python3-protobuf" >&2
  export DEBIAN_FRONTEND=noninteractive
  log=$(mktemp)
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 python3-grpcio python3-protobuf; } >"$log" 2>&1 || cat "$log" >&2
  rm -f "$log"
  ok && exit 0
fi
echo "/usr/bin/python3 cannot import grpc and google.protobuf: install them (Debian/Ubuntu: sudo apt-get install python3-grpcio python3-protobuf) and run make test again" >&2
exit 1
