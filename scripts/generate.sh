#!/usr/bin/env bash
# Regenerates gen/: Go and Python stubs of proto/ (buf.gen.yaml), then the
# Python google.rpc error types the Python example decodes error details with
# (third_party/googleapis/buf.gen.yaml). With --check it generates into a
# temporary directory instead and fails when gen/ differs from that.
# Uses the pinned bin/buf, bin/protoc-gen-go and bin/protoc-gen-go-grpc
# (make tools) and Debian's protoc and grpc_python_plugin (ensure-protoc.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/ensure-protoc.sh

generate() {
  bin/buf generate "$@"
  bin/buf generate --template third_party/googleapis/buf.gen.yaml "$@"
}

if [ "${1:-}" != --check ]; then
  generate
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
generate -o "$tmp"
if ! diff -r -x __pycache__ gen "$tmp/gen"; then
  echo "gen/ is not what make generate produces: run make generate and commit gen/" >&2
  exit 1
fi
