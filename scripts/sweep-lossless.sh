#!/usr/bin/env bash
# The lossless sweep of DFlash on the real default model (a command, not CI: it takes
# hours on CPU devices): plain vs DFlash decoding of fixtures/prompts/chat20.jsonl, 64
# tokens each, at block sizes 2, 4, 8, 16 and auto, at T=0 and at T=0.8 / top-p 0.95
# with a fixed seed, with each given drafter (default: a random one and the committed
# trained one). `dflash bench` decodes every prompt plainly once and with every block
# size, and fails if any output differs.
# Results: one JSON line per (drafter, temperature, block) in $OUT. Each pair runs in
# slices of $SLICE prompts (`dflash bench --skip --limit`), each slice's JSON kept in
# $OUT.d/; an interrupted sweep resumes at the first missing slice, and when a pair's
# slices are all there their raw totals (tokens, decode seconds, tau, accepted/tried per
# position) are summed into $OUT. Runs at nice 19 by default (NICE=0 to change).
#   scripts/sweep-lossless.sh [DRAFTER_DIR|random ...]
set -euo pipefail
cd "$(dirname "$0")/.."
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
OUT="${OUT:-sweep-lossless.jsonl}"
BLOCKS="${BLOCKS:-2,4,8,16,auto}"
PROMPT_FILE="${PROMPT_FILE:-fixtures/prompts/chat20.jsonl}"
SLICE="${SLICE:-4}"
PROMPTS=$(grep -c . "$PROMPT_FILE")
model=$(scripts/fetch-models.sh smollm2)
# DFLASH_BIN: a frozen copy of the binary (so that rebuilds don't change a running sweep).
BIN="${DFLASH_BIN:-./target/release/dflash}"
[ -n "${DFLASH_BIN:-}" ] || cargo build --release --locked -p dflash-cli
touch "$OUT"; mkdir -p "$OUT.d"
drafters=("$@")
[ ${#drafters[@]} -gt 0 ] || drafters=(drafters/smollm2-135m-instruct-dflash-b16 random)
for drafter in "${drafters[@]}"; do
  if [ "$drafter" = random ]; then
    drafter="${DFLASH_CACHE:-$HOME/.cache/dflash}/random-drafter-smollm2"
    "$BIN" make-random-drafter --model "$model" --out "$drafter" --seed 1 >/dev/null
  fi
  for temp in "0" "0.8"; do
    if python3 - "$OUT" "$drafter" "$temp" <<'PY'
import json, sys
out, drafter, temp = sys.argv[1], sys.argv[2], float(sys.argv[3])
done = any(r.get("drafter") == drafter and abs(r.get("temperature", -1.0) - temp) < 1e-6 for r in map(json.loads, filter(str.strip, open(out))))
sys.exit(0 if done else 1)
PY
    then echo "done already: $drafter T=$temp"; continue; fi
    slices=()
    for ((skip = 0; skip < PROMPTS; skip += SLICE)); do
      f="$OUT.d/$(basename "$drafter")-T$temp-s$skip.json"
      slices+=("$f")
      [ -s "$f" ] && continue
      echo "== $drafter T=$temp prompts $skip.. $(date -u +%T)"
      nice -n "${NICE:-19}" "$BIN" bench --model "$model" --drafter "$drafter" --prompts "$PROMPT_FILE" \
        --skip "$skip" --limit "$SLICE" --max-new-tokens "${TOKENS:-64}" --block "$BLOCKS" \
        --temperature "$temp" --top-p 0.95 --seed 7 --json > "$f.part"
      mv "$f.part" "$f"
    done
    python3 - "${slices[@]}" <<'PY' | tee -a "$OUT"
import json, sys
runs = {}
for path in sys.argv[1:]:
    d = json.load(open(path))
    for r in (d if isinstance(d, list) else [d]):
        a = runs.setdefault(r["block"], {k: r[k] for k in ("model", "drafter", "adapter", "block", "temperature", "top_p", "seed", "max_new_tokens")} | {
            "prompts": 0, "plain_tokens": 0, "plain_decode_s": 0.0, "dflash_tokens": 0, "dflash_decode_s": 0.0,
            "steps": 0, "tau_sum": 0, "accepted_by_position": [], "tried_by_position": [], "lossless": True, "step_costs": [], "load_s": []})
        for k in ("prompts", "plain_tokens", "plain_decode_s", "dflash_tokens", "dflash_decode_s"):
            a[k] += r[k]
        a["steps"] += r["steps"]
        a["tau_sum"] += sum(row["tau_sum"] for row in r["rows"])
        for k in ("accepted_by_position", "tried_by_position"):
            v = r[k]; a[k] += [0] * (len(v) - len(a[k]))
            for i, x in enumerate(v): a[k][i] += x
        a["lossless"] &= r["lossless"]
        a["load_s"].append(r["load_s"])
        if r.get("step_costs"): a["step_costs"].append(r["step_costs"])
for a in runs.values():
    a["plain_tok_s"] = a["plain_tokens"] / a["plain_decode_s"]
    a["dflash_tok_s"] = a["dflash_tokens"] / a["dflash_decode_s"]
    a["speedup"] = a["dflash_tok_s"] / a["plain_tok_s"]
    a["mean_tau"] = a["tau_sum"] / max(a["steps"], 1)
    a["acceptance_by_position"] = [x / t if t else 0.0 for x, t in zip(a["accepted_by_position"], a["tried_by_position"])]
    a["slices"] = len(sys.argv) - 1
    print(json.dumps(a))
PY
  done
done
