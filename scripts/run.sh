#!/usr/bin/env bash
# The main job on a fresh machine: fetch the default model (SmolLM2-135M-Instruct) and
# run it. Today that is greedy generation on the CPU reference engine, printing JSON with
# timings; the GPU engine and the plain-vs-DFlash benchmark replace it as they land.
set -euo pipefail
cd "$(dirname "$0")/.."
model=$(scripts/fetch-models.sh smollm2)
cargo build --release --locked -p dflash-cli
./target/release/dflash generate --model "$model" \
  --chat "Write a Python function that returns the n-th Fibonacci number." \
  --max-new-tokens 64 --device cpu --json
