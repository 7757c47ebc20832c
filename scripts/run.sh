#!/usr/bin/env bash
# The main job on a fresh machine: fetch the default model (SmolLM2-135M-Instruct), and
# benchmark plain against DFlash decoding with its committed drafter
# (drafters/smollm2-135m-instruct-dflash-b16) on this machine's best engine: the GPU on
# a hardware adapter, else the quantized CPU engine (a software adapter such as lavapipe
# is passed over, with a note, as `generate` and `serve` do; DEVICE=gpu forces it).
# Prints a few lines (device and engine, plain and DFlash tok/s, speedup, tau, lossless)
# and writes the whole JSON to OUT (default target/run.json), which it names.
# PROMPTS (default 8) of fixtures/prompts/chat20.jsonl, TOKENS (default 64) each,
# BLOCK (default auto), ROUNDS (default 1: each prompt decoded once each way; more
# rounds alternate the order and sum the times). BENCH=plain runs the plain-decoding
# bandwidth benchmark instead.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! ldconfig -p 2>/dev/null | grep -q libvulkan.so.1 && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mesa-vulkan-drivers libvulkan1 >/dev/null
fi
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
model=$(scripts/fetch-models.sh smollm2)
cargo build --release --locked -p dflash-cli
drafter=drafters/smollm2-135m-instruct-dflash-b16
out="${OUT:-target/run.json}"
mkdir -p "$(dirname "$out")"
device=()
rc=0
[ -n "${DEVICE:-}" ] && device=(--device "$DEVICE")
if [ "${BENCH:-dflash}" = plain ] || [ ! -f "$drafter/model.safetensors" ]; then
  ./target/release/dflash bench ${device[@]+"${device[@]}"} --model "$model" --prompt-tokens 64 --decode-tokens 32 --json > "$out" || rc=$?
else
  ./target/release/dflash bench ${device[@]+"${device[@]}"} --model "$model" --drafter "$drafter" --prompts fixtures/prompts/chat20.jsonl \
    --limit "${PROMPTS:-8}" --max-new-tokens "${TOKENS:-64}" --block "${BLOCK:-auto}" --rounds "${ROUNDS:-1}" --json > "$out" || rc=$?
fi
# The summary even when the bench failed after writing its JSON (DFlash not lossless).
if [ -s "$out" ] && command -v python3 >/dev/null; then python3 scripts/run-summary.py "$out"; else cat "$out"; fi
exit "$rc"
