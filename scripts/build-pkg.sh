#!/usr/bin/env bash
# Builds the npm package in pkg/: the engine for wasm32 (release), wasm-bindgen's JS glue
# (--target web, loaded by pkg/worker.js), then wasm-opt -Oz from npm's binaryen (Debian's
# binaryen breaks current wasm-bindgen output). Installs what is missing: the wasm32
# target, wasm-bindgen-cli of the same version as the crate, the npm tools (tests/).
# Prints the wasm size before and after wasm-opt. `npm pack` in pkg/ then makes the tarball.
# The catalogue's SmolLM2 drafter is copied into pkg/drafters/.
# A second build with threads (feature `threads`: atomics and shared memory, so std is
# rebuilt by the nightly toolchain, `-Z build-std`) goes to pkg/dist/threads/; the worker
# loads it for the CPU engine where the page is cross-origin isolated.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup target add wasm32-unknown-unknown >/dev/null 2>&1 || true
want=$(grep -A1 '^name = "wasm-bindgen"$' Cargo.lock | sed -n 's/^version = "\(.*\)"/\1/p')
if [ "$(wasm-bindgen --version 2>/dev/null | cut -d' ' -f2)" != "$want" ]; then
  # (without --locked: the locked set of the CLI names crates this mirror lacks)
  cargo install wasm-bindgen-cli --version "$want"
fi
[ -x tests/node_modules/.bin/wasm-opt ] || (cd tests && npm ci --no-audit --no-fund)
# DFLASH_TEST_HOOKS=1 (scripts/test.sh): with the fault tests' hooks, which a release
# package never has.
hooks=${DFLASH_TEST_HOOKS:+test-hooks}
cargo build --release --locked -p dflash-web --features "$hooks" --target wasm32-unknown-unknown
rm -rf pkg/dist
wasm-bindgen --target web --out-dir pkg/dist --no-typescript target/wasm32-unknown-unknown/release/dflash_web.wasm
before=$(stat -c %s pkg/dist/dflash_web_bg.wasm)
tests/node_modules/.bin/wasm-opt -Oz --enable-bulk-memory --enable-nontrapping-float-to-int --enable-sign-ext \
  --enable-mutable-globals --enable-reference-types --enable-multivalue --enable-simd \
  pkg/dist/dflash_web_bg.wasm -o pkg/dist/dflash_web_bg.opt.wasm
mv pkg/dist/dflash_web_bg.opt.wasm pkg/dist/dflash_web_bg.wasm
after=$(stat -c %s pkg/dist/dflash_web_bg.wasm)
gz=$(gzip -9 -c pkg/dist/dflash_web_bg.wasm | wc -c)

# The threaded build: rust-src for build-std; the linker makes the memory shared and
# imported (the thread workers instantiate the module on the same memory), with a 4 GiB
# ceiling, and exports the TLS symbols wasm-bindgen's thread start uses. Its own target
# dir, so that it rebuilds nothing of the first.
rustup run nightly rustc --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
rustup component add rust-src --toolchain nightly
link="--shared-memory --import-memory --max-memory=4294967296 --export=__wasm_init_tls --export=__tls_size --export=__tls_align --export=__tls_base"
RUSTFLAGS="-C target-feature=+atomics,+bulk-memory,+simd128 $(printf -- '-C link-arg=%s ' $link)" \
  cargo +nightly build -Z build-std=panic_abort,std --release --locked -p dflash-web --features "threads${hooks:+,$hooks}" \
  --target wasm32-unknown-unknown --target-dir target/wasm-threads
wasm-bindgen --target web --out-dir pkg/dist/threads --no-typescript \
  target/wasm-threads/wasm32-unknown-unknown/release/dflash_web.wasm
tests/node_modules/.bin/wasm-opt -Oz --enable-threads --enable-bulk-memory --enable-nontrapping-float-to-int \
  --enable-sign-ext --enable-mutable-globals --enable-reference-types --enable-multivalue --enable-simd \
  pkg/dist/threads/dflash_web_bg.wasm -o pkg/dist/threads/dflash_web_bg.opt.wasm
mv pkg/dist/threads/dflash_web_bg.opt.wasm pkg/dist/threads/dflash_web_bg.wasm
threads=$(stat -c %s pkg/dist/threads/dflash_web_bg.wasm)
# The catalogue's SmolLM2 drafter ships in the package (pkg/catalog.js names it).
rm -rf pkg/drafters && mkdir -p pkg/drafters/smollm2-135m-instruct-dflash-b16
cp drafters/smollm2-135m-instruct-dflash-b16/{config.json,model.safetensors,draft_vocab.json,README.md} pkg/drafters/smollm2-135m-instruct-dflash-b16/
echo "{\"wasm_bytes_before_opt\": $before, \"wasm_bytes\": $after, \"wasm_gzip_bytes\": $gz, \"threads_wasm_bytes\": $threads}"
