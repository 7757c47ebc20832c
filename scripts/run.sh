#!/usr/bin/env bash
# The main job on a fresh machine: fetch the default model (SmolLM2-135M-Instruct),
# benchmark it on this machine's GPU (lavapipe, the CPU Vulkan device, where there is
# none; installed if missing), and print the JSON. Plain decoding for now: DFlash joins
# the benchmark with its issue.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! ldconfig -p 2>/dev/null | grep -q libvulkan.so.1 && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mesa-vulkan-drivers libvulkan1 >/dev/null
fi
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
model=$(scripts/fetch-models.sh smollm2)
cargo build --release --locked -p dflash-cli
./target/release/dflash bench --model "$model" --prompt-tokens 64 --decode-tokens 32 --json
