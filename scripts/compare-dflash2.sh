#!/usr/bin/env bash
# DFlash vs DFlash2 at the same training budget on SmolLM2-135M-Instruct: both arms start
# from the committed DFlash drafter (700 steps) and train STEPS more steps on the same
# self-distilled data, seed and schedule: arm "dflash" as it is, arm "dflash2" grown into
# a DFlash2 drafter (identity convolutions, selector adding nothing at the start). Then
# mean tau of both on held-out prompts (HumanEval, MT-Bench first turns: evaluation only)
# through the engine's speculative loop (CPU reference, T=0, block 16), outputs checked
# equal to plain decoding. Every stage resumes. Results: $WORK/compare/*.json and a
# summary on stdout.
#   scripts/compare-dflash2.sh            (knobs: STEPS, EVAL_LIMIT, EVAL_TOKENS, RANK, TOPK)
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${DFLASH_TRAIN_DIR:-$HOME/.cache/dflash/train/smollm2}/compare"
DATA="${DFLASH_TRAIN_DIR:-$HOME/.cache/dflash/train/smollm2}/data.jsonl"
FROM=drafters/smollm2-135m-instruct-dflash-b16
mkdir -p "$WORK"
model=$(scripts/fetch-models.sh smollm2)
[ -s "$DATA" ] || gunzip -c "$FROM/data.jsonl.gz" > "$DATA"
cargo build --release --locked -p dflash-train >&2
T=./target/release/dflash-train
for arm in dflash dflash2; do
  extra=()
  [ "$arm" = dflash2 ] && extra=(--arch dflash2 --conv-kernel-size 2 --conv-group-size 16 --selector-rank "${RANK:-64}" --selector-top-k "${TOPK:-16}")
  $T train --model "$model" --data "$DATA" --out "$WORK/run-$arm" --init-from "$FROM" --layers 3 --block 16 \
    --steps "${STEPS:-200}" --lr 3e-4 --seqs-per-step 4 --anchors 32 --holdout 32 --checkpoint-every 25 --seed 2 "${extra[@]}" >&2
  $T export --run "$WORK/run-$arm" --out "$WORK/drafter-$arm" >&2
done
for set in humaneval mtbench; do
  for arm in dflash dflash2; do
    f="$WORK/eval-$arm-$set.json"
    [ -s "$f" ] || $T eval --model "$model" --drafter "$WORK/drafter-$arm" --prompts "$(scripts/fetch-evalsets.sh $set)" --block 16 \
      --max-new-tokens "${EVAL_TOKENS:-64}" --limit "${EVAL_LIMIT:-20}" --check-plain --json-out "$f" >/dev/null
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({"arm": sys.argv[2], "set": sys.argv[3], "prompts": d["prompts"], "mean_tau": round(d["mean_tau"], 4), "acceptance_by_position": [round(x, 3) for x in d["acceptance_by_position"][:6]], "lossless": all(r["lossless"] for r in d["rows"])}))' "$f" $arm $set
  done
done
