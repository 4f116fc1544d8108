#!/usr/bin/env bash
# Makes sure the system Python (/usr/bin/python3, not a pyenv or venv python3
# that may come first on PATH) can import grpc, google.protobuf, pytest,
# setuptools and venv (with pip), for the Python example and the Python
# package's tests that `make test` runs (examples/python, clients/python),
# and jsonschema, the validator of the official MCP Python client, which
# the gateway's tests hold its output-schema check to (mcpgateway).
# As root on Debian/Ubuntu it installs Debian's packages of them; otherwise
# it says, in one line, what to install.
set -euo pipefail

ok() {
  [ -x /usr/bin/python3 ] && /usr/bin/python3 -s -c 'import grpc, google.protobuf, pytest, setuptools, wheel, venv, ensurepip, jsonschema' >/dev/null 2>&1
}
packages="python3 python3-grpcio python3-protobuf python3-pytest python3-setuptools python3-wheel python3-venv python3-pip python3-jsonschema"

if ok; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "/usr/bin/python3 lacks some of grpc, protobuf, pytest, setuptools, venv, jsonschema: installing Debian's $packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  log=$(mktemp)
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends $packages; } >"$log" 2>&1 || cat "$log" >&2
  rm -f "$log"
  ok && exit 0
fi
echo "/usr/bin/python3 cannot import grpc, google.protobuf, pytest, setuptools, venv and jsonschema: install them (Debian/Ubuntu: sudo apt-get install $packages) and run make test again" >&2
exit 1
