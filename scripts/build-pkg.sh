#!/usr/bin/env bash
# Builds the npm package in pkg/: the engine for wasm32 (release), wasm-bindgen's JS glue
# (--target web, loaded by pkg/worker.js), then wasm-opt -Oz from npm's binaryen (Debian's
# binaryen breaks current wasm-bindgen output). Installs what is missing: the wasm32
# target, wasm-bindgen-cli of the same version as the crate, the npm tools (tests/).
# Prints the wasm size before and after wasm-opt. `npm pack` in pkg/ then makes the tarball.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup target add wasm32-unknown-unknown >/dev/null 2>&1 || true
want=$(grep -A1 '^name = "wasm-bindgen"$' Cargo.lock | sed -n 's/^version = "\(.*\)"/\1/p')
if [ "$(wasm-bindgen --version 2>/dev/null | cut -d' ' -f2)" != "$want" ]; then
  # (without --locked: the locked set of the CLI names crates this mirror lacks)
  cargo install wasm-bindgen-cli --version "$want"
fi
[ -x tests/node_modules/.bin/wasm-opt ] || (cd tests && npm ci --no-audit --no-fund)
cargo build --release --locked -p dflash-web --target wasm32-unknown-unknown
rm -rf pkg/dist
wasm-bindgen --target web --out-dir pkg/dist --no-typescript target/wasm32-unknown-unknown/release/dflash_web.wasm
before=$(stat -c %s pkg/dist/dflash_web_bg.wasm)
tests/node_modules/.bin/wasm-opt -Oz --enable-bulk-memory --enable-nontrapping-float-to-int --enable-sign-ext \
  --enable-mutable-globals --enable-reference-types --enable-multivalue --enable-simd \
  pkg/dist/dflash_web_bg.wasm -o pkg/dist/dflash_web_bg.opt.wasm
mv pkg/dist/dflash_web_bg.opt.wasm pkg/dist/dflash_web_bg.wasm
after=$(stat -c %s pkg/dist/dflash_web_bg.wasm)
gz=$(gzip -9 -c pkg/dist/dflash_web_bg.wasm | wc -c)
echo "{\"wasm_bytes_before_opt\": $before, \"wasm_bytes\": $after, \"wasm_gzip_bytes\": $gz}"
