#!/usr/bin/env bash
# The lossless sweep of DFlash on the real default model (a command, not CI: it takes
# hours on CPU devices): plain vs DFlash decoding of fixtures/prompts/chat20.jsonl, 64
# tokens each, at block sizes 2, 4, 8, 16 and auto, at T=0 and at T=0.8 / top-p 0.95
# with a fixed seed, with each given drafter (default: a random one and the committed
# trained one). Each (drafter, temperature) is one `dflash bench` run that decodes every
# prompt plainly once and with every block size, and fails if any output differs.
# Results: one JSON line per (drafter, temperature, block) in $OUT; a rerun skips the
# (drafter, temperature) pairs already there, so an interrupted sweep resumes.
#   scripts/sweep-lossless.sh [DRAFTER_DIR|random ...]
set -euo pipefail
cd "$(dirname "$0")/.."
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
OUT="${OUT:-sweep-lossless.jsonl}"
BLOCKS="${BLOCKS:-2,4,8,16,auto}"
model=$(scripts/fetch-models.sh smollm2)
cargo build --release --locked -p dflash-cli
touch "$OUT"
drafters=("$@")
[ ${#drafters[@]} -gt 0 ] || drafters=(drafters/smollm2-135m-instruct-dflash-b16 random)
for drafter in "${drafters[@]}"; do
  if [ "$drafter" = random ]; then
    drafter="${DFLASH_CACHE:-$HOME/.cache/dflash}/random-drafter-smollm2"
    ./target/release/dflash make-random-drafter --model "$model" --out "$drafter" --seed 1 >/dev/null
  fi
  for temp in "0" "0.8"; do
    if python3 - "$OUT" "$drafter" "$temp" <<'PY'
import json, sys
out, drafter, temp = sys.argv[1], sys.argv[2], float(sys.argv[3])
done = any(r.get("drafter") == drafter and r.get("temperature") == temp for r in map(json.loads, filter(str.strip, open(out))))
sys.exit(0 if done else 1)
PY
    then echo "done already: $drafter T=$temp"; continue; fi
    ./target/release/dflash bench --model "$model" --drafter "$drafter" --prompts fixtures/prompts/chat20.jsonl \
      --max-new-tokens "${TOKENS:-64}" --block "$BLOCKS" --temperature "$temp" --top-p 0.95 --seed 7 --json \
      | python3 -c '
import json, sys
d = json.load(sys.stdin)
for r in (d if isinstance(d, list) else [d]):
    r.pop("rows"); print(json.dumps(r))' | tee -a "$OUT"
  done
done
