#!/usr/bin/env bash
# Makes sure Debian's protoc and gRPC Python plugin are installed for
# `make generate`: buf.gen.yaml generates the Python stubs (clients/python/src/opledger/_gen) with /usr/bin/protoc
# (protobuf-compiler) and /usr/bin/grpc_python_plugin (protobuf-compiler-grpc),
# at the versions the Python stubs (clients/python/src/opledger/_gen) was generated with, so the output is the same on
# every machine. As root on Debian/Ubuntu it installs the missing packages;
# otherwise it says, in one line, what to install.
set -euo pipefail

want_protoc="libprotoc 3.21.12"   # Debian 12 (bookworm): protobuf-compiler 3.21.12
want_grpc="1.51."                 # Debian 12 (bookworm): protobuf-compiler-grpc 1.51.1

missing() {
  local m=()
  [ -x /usr/bin/protoc ] || m+=(protobuf-compiler)
  [ -x /usr/bin/grpc_python_plugin ] || m+=(protobuf-compiler-grpc)
  echo "${m[@]}"
}

pkgs=$(missing)
if [ -n "$pkgs" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "generating the Python stubs (clients/python/src/opledger/_gen) needs $pkgs: installing Debian's packages" >&2
  export DEBIAN_FRONTEND=noninteractive
  log=$(mktemp)
  # shellcheck disable=SC2086
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends $pkgs; } >"$log" 2>&1 || cat "$log" >&2
  rm -f "$log"
  pkgs=$(missing)
fi
if [ -n "$pkgs" ]; then
  echo "generating the Python stubs (clients/python/src/opledger/_gen) needs Debian's $pkgs: install them (sudo apt-get install $pkgs) and run make again" >&2
  exit 1
fi

got=$(/usr/bin/protoc --version)
if [ "$got" != "$want_protoc" ]; then
  echo "the Python stubs (clients/python/src/opledger/_gen) is generated with $want_protoc (Debian 12's protobuf-compiler); /usr/bin/protoc is $got, whose output differs" >&2
  exit 1
fi
if command -v dpkg-query >/dev/null 2>&1; then
  got=$(dpkg-query -W -f='${Version}' protobuf-compiler-grpc 2>/dev/null || true)
  if [ -n "$got" ] && [[ "$got" != "$want_grpc"* ]]; then
    echo "the Python stubs (clients/python/src/opledger/_gen) is generated with grpc_python_plugin ${want_grpc}x (Debian 12's protobuf-compiler-grpc); this one is $got, whose output differs" >&2
    exit 1
  fi
fi
