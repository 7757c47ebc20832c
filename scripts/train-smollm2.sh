#!/usr/bin/env bash
# Makes the committed SmolLM2-135M-Instruct drafter (drafters/smollm2-135m-instruct-dflash-b16),
# every stage resumable: run it again after an interruption and it continues.
#   scripts/train-smollm2.sh [data|train|export|vocab|eval|all]     (default: all)
# Work folder: $DFLASH_TRAIN_DIR (default ~/.cache/dflash/train/smollm2). Long: run it in
# the background (nohup scripts/train-smollm2.sh > train.out 2>&1 &).
# Knobs (environment): PROMPTS, MAX_NEW, STEPS, LAYERS, DRAFT_VOCAB, EVAL_LIMIT, EVAL_TOKENS.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="${DFLASH_TRAIN_DIR:-$HOME/.cache/dflash/train/smollm2}"
OUT=drafters/smollm2-135m-instruct-dflash-b16
mkdir -p "$WORK"
model=$(scripts/fetch-models.sh smollm2)
cargo build --release --locked -p dflash-train >&2
T=./target/release/dflash-train
stage="${1:-all}"

if [ "$stage" = data ] || [ "$stage" = all ]; then
  # The committed sets first (exactly the samples the drafter was trained on); each
  # command below then only answers prompts they lack.
  for set in data data-general data-self data-self-code data-self-stub data-self-chat; do
    if [ ! -s "$WORK/$set.jsonl" ] && [ -f "$OUT/$set.jsonl.gz" ]; then
      gunzip -c "$OUT/$set.jsonl.gz" >"$WORK/$set.jsonl"
    fi
  done
  # The target answers prompts built from Python's standard library and templates.
  $T data --model "$model" --out "$WORK/data.jsonl" --prompts "${PROMPTS:-1400}" \
    --max-new-tokens "${MAX_NEW:-160}" --batch 32 --seed 1
  # Run 5's second set: the general mix (explanations, role-play, reasoning, rewriting
  # beside code); run 7 continued it from 400 to 800 prompts.
  $T data --model "$model" --out "$WORK/data-general.jsonl" --prompts "${PROMPTS_GENERAL:-800}" \
    --max-new-tokens "${MAX_NEW:-160}" --seed 1 --mix general
  # Run 7's third set: prompts the target writes itself (its chat template's user turn
  # sampled), the widest of the three.
  $T data --model "$model" --out "$WORK/data-self.jsonl" --prompts "${PROMPTS_SELF:-640}" \
    --max-new-tokens "${MAX_NEW:-160}" --seed 1 --mix self
  # Run 8's fourth set: coding requests the target writes itself (its user turn drawn
  # after a system message about Python, each answered without it); run 9 continued it
  # from 512 to 1024 prompts.
  $T data --model "$model" --out "$WORK/data-self-code.jsonl" --prompts "${PROMPTS_SELF_CODE:-1024}" \
    --max-new-tokens "${MAX_NEW:-160}" --seed 1 --mix self-code
  # Run 10's fifth set: Python functions the target begins itself (after the same system
  # message, the user turn opened with "Complete the following Python function:" and a
  # code block at `def`), each answered in a plain chat.
  $T data --model "$model" --out "$WORK/data-self-stub.jsonl" --prompts "${PROMPTS_SELF_STUB:-512}" \
    --max-new-tokens "${MAX_NEW:-160}" --seed 1 --mix self-stub
  # Run 11's sixth set: chat requests the target writes itself after a system message
  # naming one kind of request in turn (writing, role-play, reasoning, math, extraction,
  # science, humanities), each answered in a plain chat without it.
  $T data --model "$model" --out "$WORK/data-self-chat.jsonl" --prompts "${PROMPTS_SELF_CHAT:-384}" \
    --max-new-tokens "${MAX_NEW:-160}" --seed 1 --mix self-chat
  # All in one file: code, general, self, self-code, self-stub, self-chat (the last 32
  # lines are held out).
  cat "$WORK/data.jsonl" "$WORK/data-general.jsonl" "$WORK/data-self.jsonl" \
    "$WORK/data-self-code.jsonl" "$WORK/data-self-stub.jsonl" "$WORK/data-self-chat.jsonl" \
    >"$WORK/data-mixed.jsonl"
fi
if [ "$stage" = train ] || [ "$stage" = all ]; then
  # Run 13: continues run 12's drafter (this folder at commit 23d6245, taken from git; the
  # script at 23d6245 reproduces run 12 from run 11's, and so on back to run 1) on run
  # 11's six sets, 700 steps of 4 sequences x 32 anchors at a third of run 11's learning
  # rate: gamma 2, seed 13, lr 2e-4, 4% warmup, cosine, the softmax over the responses'
  # tokens and 1024 random others (the whole vocabulary every 8th step); the last 32
  # samples held out. One uninterrupted part.
  init="$WORK/init-23d6245"
  if [ ! -f "$init/model.safetensors" ]; then
    mkdir -p "$init"
    for f in config.json model.safetensors; do git show "23d6245:$OUT/$f" >"$init/$f"; done
  fi
  $T train --model "$model" --data "$WORK/data-mixed.jsonl" --out "$WORK/run13" --layers "${LAYERS:-3}" \
    --block 16 --steps "${STEPS:-700}" --seqs-per-step 4 --anchors 32 --holdout 32 \
    --checkpoint-every 25 --init-from "$init" --sampled-head 1024 --full-head-every 8 --gamma 2 \
    --lr 2e-4 --seed 13
fi
if [ "$stage" = export ] || [ "$stage" = all ]; then
  $T export --run "$WORK/run13" --out "$OUT"
  cp "$WORK/run13/train.log.jsonl" "$OUT/train.log.jsonl"
  cp "$WORK/run13/train_config.json" "$OUT/train_config.json"
  cp "$WORK/run13/checkpoint.json" "$OUT/train_state.json"
fi
if [ "$stage" = vocab ] || [ "$stage" = export ] || [ "$stage" = all ]; then
  # The draft vocabulary: the ids the target wrote most in the data's answers (and its
  # stop tokens); greedy drafts are chosen among them, a fraction of the lm_head's rows.
  $T draft-vocab --model "$model" --data "$WORK/data-mixed.jsonl" --size "${DRAFT_VOCAB:-8192}" \
    --out "$OUT/draft_vocab.json"
  # What vLLM, SGLang and llama.cpp need of the target: the mask token's text, n_predict
  # (README: Serving beyond one machine; --d2t for vLLM's form of the draft vocabulary).
  $T serving-files --drafter "$OUT" --model "$model"
fi
if [ "$stage" = eval ] || [ "$stage" = all ]; then
  for set in humaneval mtbench; do
    $T eval --model "$model" --drafter "$OUT" --prompts "$(scripts/fetch-evalsets.sh $set)" --block 16 \
      --max-new-tokens "${EVAL_TOKENS:-96}" --limit "${EVAL_LIMIT:-40}" --json-out "$OUT/eval-$set.json" >/dev/null
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], "tau", round(d["mean_tau"],3), "acceptance", [round(x,2) for x in d["acceptance_by_position"]])' "$OUT/eval-$set.json" $set
  done
fi
