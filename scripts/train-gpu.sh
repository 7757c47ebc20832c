#!/usr/bin/env bash
# The SmolLM2-135M drafter's GPU training, for a machine with an NVIDIA GPU and a CUDA 13
# driver but no Rust toolchain and no network (the lent device machine of this workplace).
# Here, first:
#   scripts/train-gpu.sh pack DIR       build dflash-train with CUDA (scripts/build-train-cuda.sh),
#                                       strip it, and cut it with the target model, the Python
#                                       standard library the prompts come from and the two
#                                       evaluation sets into DIR/p0/, DIR/p1/, ... of at most
#                                       $PIECE bytes (what one call of the device tool can
#                                       carry beside the working tree:
#                                       scripts/device-piece-size.sh), one per call; DIR/MANIFEST
#                                       holds every file's sha256 (DIR inside the checkout and
#                                       ignored by git, e.g. .train-pack, so it can be carried)
#   scripts/train-gpu.sh unpack DIR DEST  join DIR's pieces into DEST and check every file
#                                       against the manifest (the round trip, also run here)
# then on the GPU machine, each piece carried by its own call and moved out of the way:
#   scripts/train-gpu.sh stash DIR/pN   move a piece (and the manifest) to $DEV
#   scripts/train-gpu.sh run            unpack from $DEV, then in one go: the target answers
#                                       $PROMPTS prompts on the GPU (self-distillation, batched),
#                                       the drafter trains on the GPU (as many steps as fit
#                                       its stage, timed by an 8-step probe), is exported
#                                       and evaluated (HumanEval and MT-Bench, 40 prompts x 96
#                                       tokens, block 16, T=0, on the CPU engine as here); every
#                                       stage has a time limit, cut to what is left of
#                                       BUDGET_S (540 s), and $OUT gets the drafter in pieces
#                                       of at most 16 MiB with their sha256 as soon as it is
#                                       exported, and the logs and evaluations (in
#                                       results.tar.gz, log.txt also apart) after every stage
#   scripts/train-gpu.sh run-then-check  `run`, then scripts/device-check.sh after-train
#                                       with the new drafter and what is left of TOTAL_S
# (with this workplace's device tool, the whole lease, ~15 device minutes: four calls
# back to back, each within 30 s of the last reply (the machine stays warm 30 s):
# `scripts/train-gpu.sh stash .train-pack/pN` carrying .train-pack/pN for N = 0, 1, 2,
# then, carrying .train-pack/p3 and .device-pack/bins (device-check.sh pack's binaries
# with the Vulkan loader's libraries),
# `scripts/train-gpu.sh stash .train-pack/p3 && scripts/device-check.sh stash
# .device-pack/bins && TOTAL_S=... scripts/train-gpu.sh run-then-check` with timeout_s
# 600 and TOTAL_S at most status's budget_left_s less ~110 s (570 at most: the call
# runs ~25 s past TOTAL_S, and the transfers count too); check first that the last
# call's carry fits (scripts/train-gpu.sh carry-check); give_back at
# once. $OUT comes back: the drafter's pieces, results.tar.gz and log.txt, and dc/ with
# device-check's) and back here:
#   scripts/train-gpu.sh join OUTDIR DEST   join the drafter's pieces from OUTDIR into DEST,
#                                       checked by sha256, and unpack OUTDIR/results.tar.gz
#                                       (logs, evaluations) into DEST/run-logs
#   scripts/train-gpu.sh evaluate DEST  evaluate it here (HumanEval, MT-Bench: 40 x 96,
#                                       block 16, T=0) beside the committed drafter
# The run starts from the committed drafter (INIT: its folder, in the working tree the
# device tool carries; `none`: random layers) and trains on the committed data (its six
# sets, COMMITTED_SETS; `none`: only the GPU's) followed by what the GPU wrote, the
# GPU's last 32 samples held out: a GPU slower than hoped still trains on the whole
# committed data from where the CPU runs left off, not from nothing. The step count
# (which the learning rate's cosine spans) is what a probe says fits the train stage,
# so the decay ends inside the limit; a STEPS given instead may be cut above the floor.
# Compare the result's evaluation with the committed drafter's before committing it.
# Knobs: PROMPTS (4000), MIX (general), DATA_SEED (2: other prompts than the committed
# sets' seed 1), MAX_NEW (160), BATCH (64), STEPS (unset: fitted; 3000 if the probe
# fails), MAX_STEPS (20000, the fitted count's cap), SEQS (16), ANCHORS (128: 16 times
# the CPU runs' slots per step, on the guess that a GPU step of 16 sequences, each its
# own passes, waits on kernel launches more than on rows; on the CPU the same slots learn
# far more spread over more sequences, results/drafter-anchors-per-sequence-smollm2.json:
# where time allows, raise SEQS before ANCHORS), LR (3e-4), LAYERS (3), SAMPLED (--sampled-head negatives;
# 0, the default, is the whole vocabulary: on a GPU the whole head is cheap, and the
# sample costs acc at equal slots), TF32 (true: the drafter's matrix products on TF32
# tensor cores, the target's taps in full f32), EVAL_SETS ("humaneval mtbench"; empty:
# no evaluation there, evaluate back here), DATA_S / TRAIN_S / EVAL_S (time limits: 120,
# 270, 60 s, each cut to what is left of BUDGET_S, 540 s: a stage with under 15 s left
# is skipped), EVAL_LIMIT (40), EVAL_TOKENS (96),
# DEVICE (cuda; cpu runs the same stages here, small, as a dry run of the script).
set -euo pipefail
cd "$(dirname "$0")/.."
DEV="${DEV:-/tmp/dflash-train-dev}"
OUT="${OUT:-train-out}"
MODEL=SmolLM2-135M-Instruct.Q4_1.gguf
COMMITTED_DIR=drafters/smollm2-135m-instruct-dflash-b16

# The standard library's Python files the prompt mix reads (as dflash-train walks them).
stdlib_files() {
  local lib=$1
  (cd "$lib" && find . \( -name test -o -name tests -o -name idle_test -o -name site-packages \
    -o -name dist-packages -o -name __pycache__ -o -name '.?*' \) -prune -o -name '*.py' -print)
}

pack() {
  local dir=$1 tmp model lib
  rm -rf "$dir" && mkdir -p "$dir"
  bin=$(scripts/build-train-cuda.sh | tail -1)
  model=$(scripts/fetch-models.sh smollm2)
  lib=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
  tmp=$(mktemp -d)
  mkdir -p "$tmp/files/stdlib" "$tmp/files/evalsets"
  strip -o "$tmp/files/dflash-train" "$bin"
  cp "$model" "$tmp/files/$MODEL"
  stdlib_files "$lib" | tar cf - -C "$lib" -T - | tar xf - -C "$tmp/files/stdlib"
  for set in humaneval mtbench; do cp "$(scripts/fetch-evalsets.sh $set)" "$tmp/files/evalsets/"; done
  (cd "$tmp/files" && find . -type f -print0 | sort -z | xargs -0 sha256sum) > "$dir/MANIFEST"
  tar cf - -C "$tmp/files" . | xz -T0 -3 | split -b "${PIECE:-$(scripts/device-piece-size.sh)}" -d -a 2 - "$dir/pack.part"
  rm -rf "$tmp"
  local i=0
  for f in "$dir"/pack.part*; do mkdir -p "$dir/p$i"; mv "$f" "$dir/p$i/"; i=$((i + 1)); done
  cp "$dir/MANIFEST" "$dir/p0/"
  ls -la "$dir"/p*
}

# xz -d, or Python's lzma where the machine has no xz (the GPU machine's image is not
# known to have it).
xz_decompress() {
  if command -v xz >/dev/null; then xz -d; else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)'
  fi
}

unpack() {
  local dir manifest dest=$2
  dir=$(realpath "$1")
  manifest=$(find "$dir" -name MANIFEST | head -1)
  mkdir -p "$dest"
  find "$dir" -name 'pack.part*' -print0 | sort -z | xargs -0 cat | xz_decompress | tar xf - -C "$dest"
  (cd "$dest" && sha256sum --quiet -c "$manifest")
  echo "unpacked $(wc -l <"$manifest") files into $dest, sha256 checked"
}

# Writes $1/train-data.jsonl: the committed sets of folder $2 (`none`: none) in the
# order train-smollm2.sh trains on them, then $1/data.jsonl (the GPU's). Prints how many
# samples to hold out: the GPU's last 32 where it wrote that many, else none (the
# committed ones are what the initial drafter trained on).
training_data() {
  local w=$1 sets=$2 set n=0
  : >"$w/train-data.jsonl"
  if [ "$sets" != none ]; then
    for set in data data-general data-self data-self-code data-self-stub data-self-chat; do
      if [ ! -f "$sets/$set.jsonl.gz" ]; then
        echo "$sets/$set.jsonl.gz missing (COMMITTED_SETS=none trains on the GPU's data only)" | tee -a "$w/results/log.txt" >&2
        return 1
      fi
      gunzip -c "$sets/$set.jsonl.gz" >>"$w/train-data.jsonl"
    done
  fi
  # The GPU's samples, but a line that a time limit cut short.
  if [ -f "$w/data.jsonl" ]; then
    python3 -c 'import json, sys
for line in sys.stdin.buffer:
    try:
        json.loads(line)
    except ValueError:
        continue
    sys.stdout.buffer.write(line if line.endswith(b"\n") else line + b"\n")' <"$w/data.jsonl" >"$w/data-whole.jsonl"
    cat "$w/data-whole.jsonl" >>"$w/train-data.jsonl"; n=$(wc -l <"$w/data-whole.jsonl")
  fi
  if [ "$n" -ge 32 ]; then echo 32; else echo 0; fi
}

# Training steps that fit the train stage: a probe of 8 steps in its own folder times a
# step (the median after its first two) and the start-up (its wall time less its steps);
# the stage's limit is train_limit's after the probe, less 10%;
# at most MAX_STEPS (20000). Reads t, w, log and deadline of run_on_gpu.
fitted_steps() {
  local probe="$w/probe" t0=$SECONDS limit
  limit=$(train_limit)
  # No probe where the stage could not pay for its start-up: a floor of steps instead.
  if [ "$limit" -lt 60 ]; then echo 1; return 0; fi
  rm -rf "$probe"
  timeout -k 10 $((limit < 120 ? limit : 120)) "$t" train "$@" --out "$probe" --steps 1000 --stop-at 8 \
    --checkpoint-every 1000 >>"$log" 2>&1 || return 1
  limit=$(train_limit)
  python3 - "$probe/train.log.jsonl" $((SECONDS - t0)) "$limit" "${MAX_STEPS:-20000}" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
wall, limit, cap = float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
step = statistics.median(r["step_s"] for r in (rows[2:] or rows))
startup = max(0.0, wall - sum(r["step_s"] for r in rows))
print(max(1, min(cap, int((0.9 * limit - startup) / step))))
PY
}

# The train stage's limit: TRAIN_S (270) or what is left of the budget less the
# export's reserve (EXPORT_RESERVE_S, 25), so that the drafter is always exported.
train_limit() {
  local limit=$((deadline - SECONDS - 5 - ${EXPORT_RESERVE_S:-25}))
  echo $((limit < ${TRAIN_S:-270} ? limit : ${TRAIN_S:-270}))
}

run_on_gpu() {
  mkdir -p "$OUT"; OUT=$(realpath "$OUT")
  local w="$DEV/work" t res="$DEV/work/results" log="$DEV/work/results/log.txt"
  local deadline=$((SECONDS + ${BUDGET_S:-540}))
  mkdir -p "$res"
  # The device tool brings back at most 8 files: logs and evaluations travel as one
  # (results.tar.gz, log.txt also apart), rewritten after every stage.
  bundle() {
    tar czf "$OUT/results.tmp" -C "$res" . && mv "$OUT/results.tmp" "$OUT/results.tar.gz"
    cp "$log" "$OUT/log.txt"
  }
  [ -d "$w/files" ] || unpack "$DEV" "$w/files" | tee -a "$log"
  t="$w/files/dflash-train"; chmod +x "$t"
  # cuBLAS, cuRAND and the CUDA runtime from the machine's PyTorch environment.
  if [ "${DEVICE:-cuda}" = cuda ]; then
    # shellcheck source=scripts/train-gpu-env.sh
    source scripts/train-gpu-env.sh "$t" 2>>"$log" || { echo "CUDA libraries missing" | tee -a "$log"; bundle; return 1; }
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >>"$log" 2>&1 || true
  local model="$w/files/$MODEL" run="$w/run" drafter="$w/drafter" sampled=()
  [ "${SAMPLED:-0}" = 0 ] || sampled=(--sampled-head "${SAMPLED}")
  stage() { # limit name command...: the limit cut to what is left of BUDGET_S
    local limit=$1 name=$2 left=$((deadline - SECONDS - 5)); shift 2
    if [ "$left" -lt 15 ] || [ "$limit" -lt 1 ]; then
      echo "== [$SECONDS s] $name: skipped, $left s left of the budget" | tee -a "$log"; return 0
    fi
    [ "$limit" -le "$left" ] || limit=$left
    echo "== [$SECONDS s] $name: $*" | tee -a "$log"
    timeout -k 10 "$limit" "$@" >>"$log" 2>&1 && echo "== [$SECONDS s] $name: ok" | tee -a "$log" \
      || echo "== [$SECONDS s] $name: rc=$?" | tee -a "$log"
    bundle
  }
  stage "${DATA_S:-120}" data "$t" data --model "$model" --out "$w/data.jsonl" --prompts "${PROMPTS:-4000}" \
    --max-new-tokens "${MAX_NEW:-160}" --batch "${BATCH:-64}" --seed "${DATA_SEED:-2}" --mix "${MIX:-general}" \
    --engine candle --device "${DEVICE:-cuda}" --stdlib "$w/files/stdlib"
  # The committed drafter's data (its six sets travel in the working tree), then what the
  # GPU wrote: a data stage cut short still trains on ~0.95 M tokens.
  local init=() holdout
  [ "${INIT:-$COMMITTED_DIR}" = none ] || init=(--init-from "${INIT:-$COMMITTED_DIR}")
  holdout=$(training_data "$w" "${COMMITTED_SETS:-$COMMITTED_DIR}") || { bundle; return 1; }
  echo "training data: $(wc -l <"$w/train-data.jsonl") samples, the last $holdout held out; init: ${init[*]:-random}" | tee -a "$log"
  local train=(--model "$model" --data "$w/train-data.jsonl" --device "${DEVICE:-cuda}" --layers "${LAYERS:-3}"
    --block 16 --seqs-per-step "${SEQS:-16}" --anchors "${ANCHORS:-128}" --holdout "$holdout" --lr "${LR:-3e-4}"
    --tf32 "${TF32:-true}" "${init[@]}" "${sampled[@]}")
  # Unless STEPS is given, as many steps as fit the train stage's limit, timed by a probe
  # (so the learning rate's cosine ends inside the limit on a GPU of any speed).
  local steps=${STEPS:-}
  if [ -z "$steps" ]; then
    steps=$(fitted_steps "${train[@]}") || steps=3000
    echo "== [$SECONDS s] steps: $steps" | tee -a "$log"
  fi
  local limit
  limit=$(train_limit)
  [ "$limit" -ge 30 ] || limit=0 # a train stage under 30 s only pays its start-up: skipped
  stage "$limit" train "$t" train "${train[@]}" --out "$run" --steps "$steps" --checkpoint-every 50
  # The last checkpoint is exported even when the time limit cut the run short, and the
  # drafter goes out at once (pieces of at most 16 MiB), before the evaluations.
  stage 30 export "$t" export --run "$run" --out "$drafter"
  cp "$run/train.log.jsonl" "$run/train_config.json" "$res/" 2>/dev/null || true
  # The committed draft vocabulary (the target's most written ids in that data): the
  # engines draft among them, as they do with the committed drafter.
  [ ! -f "$drafter/model.safetensors" ] || [ ! -f "$COMMITTED_DIR/draft_vocab.json" ] \
    || cp "$COMMITTED_DIR/draft_vocab.json" "$drafter/"
  if [ -f "$drafter/model.safetensors" ]; then
    (cd "$drafter" && tar cf - . | split -b 16000000 -d -a 2 - "$OUT/drafter.part")
    (cd "$drafter" && sha256sum -- *) >"$OUT/drafter.sha256"
  fi
  bundle
  for set in ${EVAL_SETS-humaneval mtbench}; do
    stage "${EVAL_S:-60}" "eval $set" "$t" eval --model "$model" --drafter "$drafter" \
      --prompts "$w/files/evalsets/$set.jsonl" --block 16 --max-new-tokens "${EVAL_TOKENS:-96}" --limit "${EVAL_LIMIT:-40}" \
      --json-out "$res/eval-$set.json"
  done
  ls -la "$OUT" | tee -a "$log"
  bundle
}

join_drafter() {
  local from=$1 dest=$2
  mkdir -p "$dest"
  if [ -f "$from/results.tar.gz" ]; then
    mkdir -p "$dest/run-logs" && tar xzf "$from/results.tar.gz" -C "$dest/run-logs"
    echo "logs and evaluations in $dest/run-logs"
  fi
  if ! ls "$from"/drafter.part* >/dev/null 2>&1; then
    echo "no drafter came back" >&2; return 1
  fi
  cat "$from"/drafter.part* | tar xf - -C "$dest"
  (cd "$dest" && sha256sum --quiet -c "$(realpath "$from/drafter.sha256")")
  echo "drafter joined into $dest, sha256 checked"
}

# The trainer, then (same call, same machine) the GPU checks of scripts/device-check.sh
# with the new drafter: `run` gets TOTAL_S (570) less CHECK_S (150) and evaluates nothing
# there unless EVAL_SETS says (evaluate back here, on this machine's CPU, at no device
# time); device-check.sh after-train gets what is left of TOTAL_S, with the model from
# this pack (its binaries stashed beforehand: device-check.sh stash .device-pack/bins)
# and its results in $OUT/dc.
run_then_check() {
  local t0=$SECONDS total=${TOTAL_S:-570} trained="$DEV/work/drafter" models=/tmp/dflash-dev/cache/models
  local humaneval="$DEV/work/files/evalsets/humaneval.jsonl"
  [ "$total" -le 570 ] || total=570
  BUDGET_S=$((total - ${CHECK_S:-150})) EVAL_SETS=${EVAL_SETS-} "$0" run || echo "train-gpu.sh run: rc=$?"
  mkdir -p "$models" "$OUT/dc"
  cp "$DEV/work/files/$MODEL" "$models/" || echo "no model from the pack"
  [ -f "$trained/model.safetensors" ] || trained=$COMMITTED_DIR
  DEV=/tmp/dflash-dev OUT="$(realpath "$OUT")/dc" TRAINED=$trained EVAL_PROMPTS=$humaneval \
    BUDGET_S=$((total - (SECONDS - t0))) scripts/device-check.sh after-train
}

# The joined drafter in DEST evaluated here as the committed one was (HumanEval and
# MT-Bench, EVAL_LIMIT prompts x EVAL_TOKENS tokens, block 16, T=0, the CPU reference
# loop): DEST/eval-<set>.json, and its tau and slot-1 acceptance beside the committed
# drafter's.
evaluate() {
  local dest=$1 model set
  model=$(scripts/fetch-models.sh smollm2)
  cargo build --release --locked -p dflash-train >&2
  for set in humaneval mtbench; do
    ./target/release/dflash-train eval --model "$model" --drafter "$dest" \
      --prompts "$(scripts/fetch-evalsets.sh $set)" --block 16 --max-new-tokens "${EVAL_TOKENS:-96}" \
      --limit "${EVAL_LIMIT:-40}" --json-out "$dest/eval-$set.json" >/dev/null
    python3 - "$dest/eval-$set.json" "$COMMITTED_DIR/eval-$set.json" "$set" <<'PY'
import json, sys
new, old = (json.load(open(p)) for p in sys.argv[1:3])
print(f"{sys.argv[3]} ({new['prompts']} x {new['max_new_tokens']}): tau {new['mean_tau']:.3f}, slot 1 "
      f"{new['acceptance_by_position'][0]:.3f}; committed ({old['prompts']} x {old['max_new_tokens']}): "
      f"tau {old['mean_tau']:.3f}, slot 1 {old['acceptance_by_position'][0]:.3f}")
PY
  done
}

# Whether the last call's carry (.train-pack's last piece, .device-pack/bins) fits
# beside the working tree in one call of the device tool.
carry_check() {
  local room need last
  last=$(find .train-pack -maxdepth 1 -name 'p*' -type d | sort -V | tail -1)
  room=$(MARGIN=0 scripts/device-piece-size.sh)
  need=$(du -cb "$last" .device-pack/bins 2>/dev/null | tail -1 | cut -f1)
  echo "last call: $last and .device-pack/bins: $need bytes beside the tree; room: $room"
  [ "$need" -le "$room" ] || { echo "too big for one call" >&2; return 1; }
}

case "${1:-}" in
  run-then-check) run_then_check ;;
  carry-check) carry_check ;;
  evaluate) evaluate "$2" ;;
  pack) pack "$2" ;;
  unpack) unpack "$2" "$3" ;;
  stash) mkdir -p "$DEV" && mv "$2"/* "$DEV"/ && ls -la "$DEV" ;;
  run) run_on_gpu ;;
  join) join_drafter "$2" "$3" ;;
  *) sed -n '2,/^set -euo/{/^#/p}' "$0"; exit 2 ;;
esac
