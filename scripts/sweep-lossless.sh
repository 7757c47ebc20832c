#!/usr/bin/env bash
# The lossless sweep of DFlash on the real default model (a command, not CI: it takes
# long on CPU devices): plain vs DFlash decoding of fixtures/prompts/chat20.jsonl, 64
# tokens each, at block sizes 2, 4, 8, 16 and auto, at T=0 and at T=0.8 / top-p 0.95
# with a fixed seed, with the given drafter (default: a random one). Every bench run
# fails if any output differs from plain decoding. Results: JSON lines in $OUT.
#   scripts/sweep-lossless.sh [DRAFTER_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
OUT="${OUT:-sweep-lossless.jsonl}"
model=$(scripts/fetch-models.sh smollm2)
cargo build --release --locked -p dflash-cli
drafter="${1:-}"
if [ -z "$drafter" ]; then
  drafter="${DFLASH_CACHE:-$HOME/.cache/dflash}/random-drafter-smollm2"
  ./target/release/dflash make-random-drafter --model "$model" --out "$drafter" --seed 1 >/dev/null
fi
for temp in "0" "0.8"; do
  for block in 2 4 8 16 auto; do
    ./target/release/dflash bench --model "$model" --drafter "$drafter" --prompts fixtures/prompts/chat20.jsonl \
      --max-new-tokens "${TOKENS:-64}" --block "$block" --temperature "$temp" --top-p 0.95 --seed 7 --json \
      | python3 -c 'import json,sys; d=json.load(sys.stdin); d.pop("rows"); print(json.dumps(d))' | tee -a "$OUT"
  done
done
