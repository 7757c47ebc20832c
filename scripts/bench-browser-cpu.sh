#!/usr/bin/env bash
# Browser CPU speeds in headless chromium on the prompts `dflash bench` uses: wllama
# (llama.cpp in wasm, npm @wllama/wllama) single-threaded, then with 2 threads
# (cross-origin isolated), then our pkg/ the same two ways (--engine dflash, when pkg/dist
# is built).
#   scripts/bench-browser-cpu.sh [PROMPTS (8)] [TOKENS (32)] [ENGINES ("wllama dflash")]
# One JSON object per run on stdout (see tests/bench/README.md); progress on stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
prompts=${1:-8} tokens=${2:-32} engines=${3:-wllama dflash}
[ -d tests/bench/node_modules/@wllama/wllama ] || (cd tests/bench && npm ci --no-audit --no-fund >&2)
for engine in $engines; do
  if [ "$engine" = dflash ] && [ ! -f pkg/dist/dflash_web_bg.wasm ]; then
    echo "[bench] skipping dflash: pkg/dist is not built (scripts/build-pkg.sh)" >&2
    continue
  fi
  for t in 1 2; do
    node tests/bench/wllama.mjs --engine "$engine" --threads "$t" --prompts "$prompts" --tokens "$tokens"
  done
done
