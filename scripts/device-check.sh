#!/usr/bin/env bash
# The real-GPU checks, for a machine with a GPU but no Rust toolchain and no network
# (the lent device machine of this workplace): prebuilt, stripped binaries (`dflash` and
# the dflash-gpu test binaries that run there, as `t_<name>`: one xz stream) and the
# default model travel in pieces, each small enough for one call of the device tool
# (which carries at most 64 MiB with the working tree: `scripts/device-piece-size.sh`),
# and everything the run writes comes back as one file, results.tar.gz (the tool brings
# back at most 8 files). Here, first:
#   scripts/device-check.sh pack DIR    build and strip the binaries into DIR/p0/ (one xz
#                                       stream, about 10 MB), with the model's sha256 and
#                                       its first bytes, the rest of the model in DIR/p1/,
#                                       DIR/p2/, ...: at most $PIECE bytes each (DIR inside
#                                       the checkout and ignored by git, e.g. .device-pack,
#                                       so that it can be carried). p0 alone runs
#                                       everything but the real model's steps (SmolLM2's
#                                       profile then on its shapes with random weights)
# then on the machine, each piece carried by its own call (and .gl/, the Debian packages
# of the Vulkan loader, `apt-get download libvulkan1`, where the machine has none):
#   scripts/device-check.sh stash DIR/pN   move a piece to $DEV
# and, carrying the last piece, one call of at most 10 minutes for everything:
#   scripts/device-check.sh stash DIR/pN && scripts/device-check.sh all
# (`all`: setup, profile, run, tests, in that order of importance, within BUDGET_S, 470 s
# unless set: each step's limit is cut to what is left, and a step with under 15 s left
# is skipped). Back here: `tar xzf <files_at>/results.tar.gz -C device-out`. With the
# tool: each stash call carries [".device-pack/pN"] (and ".gl" where needed). The pack
# is 4 pieces (28 MB each but the last; the working tree takes the rest of a call's
# 64 MiB). Device time counts from the start to the give-back, the gaps between calls
# too, and the machine stays warm only 30 s after a call (a cold start loses what was
# stashed): make the calls back to back, give the last one BUDGET_S = status's
# budget_left_s less ~90 s (at most 540) and timeout_s 600, then give_back at once. A
# task's 15 minutes hold the start (1-2 min), three stash calls and an `all` of ~8
# minutes. scripts/train-gpu.sh (the drafter's GPU run) takes 4 pieces and a call of
# ~9 minutes of its own: 15 minutes hold one of the two, or both at once with
# `scripts/train-gpu.sh run-then-check` (the plan for a task's lease: the trainer's four
# pieces, this pack's binaries (DIR/bins: p0 without its model part) riding with the
# last: the model comes from the trainer's pack; then this script's `after-train` verb
# with what is left of the call: see train-gpu.sh).
# The verbs
# `all` strings together, each also alone:
#   scripts/device-check.sh setup     unpack the binaries, join the model once all its
#                                     parts are here (its sha256 checked against the
#                                     packed one), list the adapters
#   scripts/device-check.sh tests     the GPU tests: synthetic models, then the real model
#   scripts/device-check.sh run       the DFlash benchmarks of SmolLM2 (plain decode at 512
#                                     prompt tokens, then the trained and a random drafter
#                                     at each temperature and block)
#   scripts/device-check.sh profile   the engine profile (no model file needed for
#                                     the synthetic shapes): `dflash bench --profile`
#                                     of SmolLM2 at 64 and 512 prompt tokens, of its
#                                     DFlash step, plain decode greedy and at T=0.8,
#                                     the Intel Xe2 tuning entry, one GEMV row per
#                                     thread against the table's, and of the
#                                     synthetic qwen3-8b and qwen2.5-32b pairs, with
#                                     their DFlash runs at the published acceptance
#                                     (--accept-profile; qwen3-8b's also drafting
#                                     among 8192 ids), and the measured step costs
#                                     (16-row verify against one row) of the
#                                     synthetic qwen3-coder-30b-a3b mixture
#   scripts/device-check.sh after-train  (after scripts/train-gpu.sh run, the model
#                                     already in $DFLASH_CACHE) the trained drafter
#                                     ($TRAINED) against the committed one, then the
#                                     profile, within BUDGET_S
# Knobs: TRAINED (the drafter that run, profile and after-train benchmark; the committed
# one's folder unless set), EVAL_PROMPTS (after-train's second prompt set), TOKENS (64),
# BLOCKS (2,4,8,16,auto), DRAFTERS ("trained random"), TEMPS ("0 0.8") and BENCH_LIMIT
# (100 s per benchmark) shape the DFlash benchmarks; SHAPES ("qwen3-8b qwen2.5-32b") the
# synthetic profiles; BUDGET_S the whole call's seconds (none for a
# verb alone); ADAPTER (NVIDIA) the adapter's name.
# Everything is logged to $RES ($DEV/results) and bundled into $OUT (./device-out where
# unset) after each step, so one call brings back everything that finished in it.
set -uo pipefail
cd "$(dirname "$0")/.."
DEV="${DEV:-/tmp/dflash-dev}"
RES="${RES:-$DEV/results}"
BACK="${OUT:-device-out}"
mkdir -p "$DEV" "$RES" "$BACK"; DEV=$(realpath "$DEV"); RES=$(realpath "$RES"); BACK=$(realpath "$BACK")
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}" DFLASH_CACHE="$DEV/cache"
BIN="$DEV/bin"
MODEL="$DFLASH_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
# The dflash-gpu test binaries that run there: on synthetic models, then the real model.
GPU_TESTS="dflash_gpu ops fused engine dflash stream_load synthetic moe hybrid zlab"
REAL_TESTS="real_models"
COMMITTED=drafters/smollm2-135m-instruct-dflash-b16
TRAINED="${TRAINED:-$COMMITTED}"
# NVIDIA's Vulkan driver where the container mounts it outside the loader's search path.
nv_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -n "${VK_DRIVER_FILES:-}" ] || [ ! -f "$nv_icd" ] || export VK_DRIVER_FILES="$nv_icd"
DEADLINE=$((SECONDS + ${BUDGET_S:-1000000}))
log() { echo "== [$SECONDS s] $*" | tee -a "$RES/log.txt"; }
bundle() {
  tar czf "$BACK/results.tmp" -C "$RES" . && mv "$BACK/results.tmp" "$BACK/results.tar.gz"
}
DONE_STEPS=""
step() { # limit-seconds name command...: a step that already ran (rc 0) is not run again
  local limit=$1 name=$2 left=$((DEADLINE - SECONDS - 5)); shift 2
  case "$DONE_STEPS" in *"|$name|"*) log "$name: done already"; return ;; esac
  if [ "$left" -lt 15 ]; then
    log "$name: skipped, ${left} s left of the budget"; return
  fi
  [ "$limit" -le "$left" ] || limit=$left
  log "$name: $*"
  timeout -k 10 "$limit" "$@" >>"$RES/log.txt" 2>&1
  local rc=$?
  log "$name: rc=$rc"
  [ "$rc" -ne 0 ] || DONE_STEPS="$DONE_STEPS|$name|"
  bundle
}

# The test binaries read fixtures at the path of the checkout they were built in.
built_in="${BUILT_IN:-/work/main}"
if [ ! -e "$built_in/Cargo.toml" ]; then
  mkdir -p "$(dirname "$built_in")" && ln -sfn "$PWD" "$built_in"
fi

pack() (
  set -e
  local dir=$1 model tmp exe n piece first i f
  model=$(scripts/fetch-models.sh smollm2)
  piece=${PIECE:-$(scripts/device-piece-size.sh)}
  cargo build --release --locked -p dflash-cli
  tmp=$(mktemp -d); mkdir -p "$tmp/bin"
  strip -o "$tmp/bin/dflash" target/release/dflash
  for exe in $(cargo test --release --locked -p dflash-gpu --no-run --message-format=json \
    | python3 -c 'import json, sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable")]'); do
    n=$(basename "$exe"); n=${n%-*}
    case " $GPU_TESTS $REAL_TESTS " in *" $n "*) strip -o "$tmp/bin/t_$n" "$exe" ;; esac
  done
  for n in $GPU_TESTS $REAL_TESTS; do
    [ -x "$tmp/bin/t_$n" ] || { echo "pack: no test binary $n" >&2; exit 1; }
  done
  rm -rf "$dir" && mkdir -p "$dir/p0"
  # xz -9: its 64 MiB window sees what the binaries share (about 10 MB against 25 at -6).
  tar cf - -C "$tmp" bin | xz -T0 -9 > "$dir/p0/bins.tar.xz"
  rm -rf "$tmp"
  (cd "$(dirname "$model")" && sha256sum "$(basename "$MODEL")") > "$dir/p0/model.sha256"
  # The model fills the rest of p0, then one piece per call.
  first=$((piece - $(du -cb "$dir"/p0/* | awk 'END {print $1}') - 4096))
  [ "$first" -gt 0 ] || { echo "pack: pieces of $piece bytes leave no room beside the binaries" >&2; exit 1; }
  head -c "$first" "$model" > "$dir/p0/model.part00"
  tail -c +$((first + 1)) "$model" | split -b "$piece" -d -a 2 --numeric-suffixes=1 - "$dir/model.part"
  for f in "$dir"/model.part*; do
    [ -e "$f" ] || continue
    i=$((10#${f##*.part})); mkdir -p "$dir/p$i"; mv "$f" "$dir/p$i/"
  done
  # The binaries alone too (hard links), for a call that brings the model another way
  # (scripts/train-gpu.sh run-then-check).
  mkdir -p "$dir/bins" && ln "$dir/p0/bins.tar.xz" "$dir/p0/model.sha256" "$dir/bins/"
  ls -la "$dir"/p* "$dir/bins"
)

# The model from its parts once all of them are here (its sha256 says so).
join_model() {
  [ -f "$MODEL" ] && return 0
  ls "$DEV"/model.part* >/dev/null 2>&1 || return 1
  if (cd "$DEV" && cat model.part* | sha256sum | cut -d' ' -f1) | grep -qx "$(cut -d' ' -f1 "$DEV/model.sha256")"; then
    mkdir -p "$(dirname "$MODEL")" && cat "$DEV"/model.part* > "$MODEL" && rm -f "$DEV"/model.part*
  else
    log "the model is not all here yet ($(ls "$DEV"/model.part* | wc -l) parts): its steps are skipped"
    return 1
  fi
}

setup() {
  # The Vulkan loader, carried as Debian packages in .gl/ where the machine has none.
  if ! grep -q libvulkan.so.1 <(ldconfig -p) && ls .gl/*.deb >/dev/null 2>&1; then
    for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
  fi
  if [ -f "$DEV/bins.tar.xz" ]; then
    # xz, or Python's lzma where the machine has no xz.
    if command -v xz >/dev/null; then xz -dc "$DEV/bins.tar.xz"; else
      python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$DEV/bins.tar.xz"
    fi | tar xf - -C "$DEV" && rm "$DEV/bins.tar.xz"
  fi
  join_model
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >>"$RES/log.txt" 2>&1
  step 60 adapters "$BIN/dflash" adapters
}

tests() {
  local t
  for t in $GPU_TESTS; do
    (cd crates/dflash-gpu && export DFLASH_REQUIRE_GPU=1 && step 90 "test $t" "$BIN/t_$t" --test-threads 8)
  done
  if [ -f "$MODEL" ]; then
    (cd crates/dflash-gpu && export DFLASH_REQUIRE_GPU=1 DFLASH_REQUIRE_MODELS=1 && step 150 "test real_models" "$BIN/t_real_models" --test-threads 4)
  fi
  grep -E "^test result|panicked|FAILED" "$RES/log.txt" | tail -20
}

run() {
  [ -f "$MODEL" ] || { log "run: no model here, no benchmarks"; return; }
  local model=$MODEL drafter path t
  local a=(--model "$model" --adapter "${ADAPTER:-NVIDIA}")
  step 60 "bench plain" sh -c "\"$BIN/dflash\" bench ${a[*]} --prompt-tokens 512 --decode-tokens 128 --json > $RES/bench-plain.json"
  local d=(--prompts fixtures/prompts/chat20.jsonl --max-new-tokens "${TOKENS:-64}" --block "${BLOCKS:-2,4,8,16,auto}" --top-p 0.95 --seed 7 --json)
  case " ${DRAFTERS:-trained random} " in
    *" random "*) step 60 "random drafter" "$BIN/dflash" make-random-drafter --model "$model" --out "$DEV/random-drafter" --seed 1 ;;
  esac
  for drafter in ${DRAFTERS:-trained random}; do
    path=$TRAINED; [ "$drafter" = random ] && path="$DEV/random-drafter"
    for t in ${TEMPS:-0 0.8}; do
      step "${BENCH_LIMIT:-100}" "bench $drafter T=$t" sh -c "\"$BIN/dflash\" bench ${a[*]} --drafter $path --temperature $t ${d[*]} > $RES/bench-$drafter-T$t-n${TOKENS:-64}.jsonl"
    done
  done
}

profile() {
  # Everything here prints JSON under $RES; the synthetic shapes need no model file.
  local model=$MODEL p t piped accept shape
  local a=(--adapter "${ADAPTER:-NVIDIA}" --profile --json)
  if [ -f "$model" ]; then
    for p in 64 512; do
      step 60 "profile smollm2 p$p" sh -c "\"$BIN/dflash\" bench --model $model ${a[*]} --prompt-tokens $p --decode-tokens 64 > $RES/profile-smollm2-p$p.json"
    done
    # Sampling against greedy (aim: T=0.8 within 10%), plain decode as generation does it.
    for t in 0 0.8; do
      step 40 "bench smollm2 T=$t" sh -c "\"$BIN/dflash\" bench --model $model --adapter \"${ADAPTER:-NVIDIA}\" --json --prompt-tokens 64 --decode-tokens 128 --temperature $t --top-p 0.95 > $RES/bench-smollm2-T$t.json"
    done
    # The Intel Xe2 entry of the tuning table on this GPU (its lanes per shape).
    step 60 "profile smollm2 p64 intel-xe2" sh -c "\"$BIN/dflash\" bench --model $model ${a[*]} --tuning intel-xe2 --prompt-tokens 64 --decode-tokens 64 > $RES/profile-smollm2-p64-intel-xe2.json"
    # One output row per GEMV thread against the table's 4 (the 16-row step's cost).
    step 60 "profile smollm2 p64 outs1" sh -c "\"$BIN/dflash\" bench --model $model ${a[*]} --gemv-outputs 1 --prompt-tokens 64 --decode-tokens 64 > $RES/profile-smollm2-p64-outs1.json"
    # The RMSNorm apart against fused into the next GEMV (the GPU tuning's default).
    step 40 "profile smollm2 p64 norm apart" sh -c "\"$BIN/dflash\" bench --model $model ${a[*]} --fuse-norm false --prompt-tokens 64 --decode-tokens 64 > $RES/profile-smollm2-p64-norm-apart.json"
    # The norm split into the residual GEMVs (the CPU adapters' default) against the prologue.
    step 40 "profile smollm2 p64 norm in residual" sh -c "\"$BIN/dflash\" bench --model $model ${a[*]} --norm-in-residual true --prompt-tokens 64 --decode-tokens 64 > $RES/profile-smollm2-p64-norm-in-residual.json"
    # DFlash steps pipelined (the GPU tuning's default) against one at a time, same run
    # settings (the host's read-back latency per step is what pipelining hides).
    for piped in true false; do
      step 40 "bench smollm2 dflash pipelined=$piped" sh -c "\"$BIN/dflash\" bench --model $model --adapter \"${ADAPTER:-NVIDIA}\" --json --pipelined $piped --drafter $TRAINED --prompts fixtures/prompts/chat20.jsonl --limit 4 --max-new-tokens 64 --block 4,16,auto > $RES/bench-smollm2-dflash-pipelined-$piped.json"
    done
    step 90 "profile smollm2 dflash" sh -c "\"$BIN/dflash\" bench --model $model ${a[*]} --drafter $TRAINED --prompts fixtures/prompts/chat20.jsonl --limit 4 --max-new-tokens 64 --block 16,auto > $RES/profile-smollm2-dflash.json"
    # The same with the drafts over the whole vocabulary (the drafter's draft_vocab.json off).
    step 60 "profile smollm2 dflash full head" sh -c "\"$BIN/dflash\" bench --model $model ${a[*]} --drafter $TRAINED --draft-vocab false --prompts fixtures/prompts/chat20.jsonl --limit 4 --max-new-tokens 64 --block 16,auto > $RES/profile-smollm2-dflash-full-head.json"
  fi
  # Conditional per-slot acceptance with mean tau 6.5 at block 16 (z-lab's published
  # DFlash figure for Qwen3-8B on HumanEval; the per-slot shape is ours).
  accept=0.96,0.93,0.90,0.87,0.84,0.80,0.76,0.72,0.68,0.64,0.60,0.56,0.52,0.48,0.44
  # Without the model file, SmolLM2's shapes with random weights stand in for its profile.
  local shapes=${SHAPES:-qwen3-8b qwen2.5-32b}
  [ -f "$model" ] || shapes="smollm2-135m $shapes"
  for shape in $shapes; do
    step 120 "profile $shape" sh -c "\"$BIN/dflash\" bench --synthetic $shape ${a[*]} --prompt-tokens 64 --decode-tokens 64 > $RES/profile-$shape.json"
    step 120 "profile $shape outs1" sh -c "\"$BIN/dflash\" bench --synthetic $shape ${a[*]} --gemv-outputs 1 --prompt-tokens 64 --decode-tokens 64 > $RES/profile-$shape-outs1.json"
    step 120 "profile $shape dflash" sh -c "\"$BIN/dflash\" bench --synthetic $shape ${a[*]} --drafter synthetic --limit 2 --prompt-tokens 64 --max-new-tokens 128 --block 16 --accept-profile $accept > $RES/profile-$shape-dflash.json"
  done
  # GEMVs on 8-bit activations (packed integer dot products) against f32, plain and the
  # DFlash step, on the 8B and 32B shapes.
  for shape in qwen3-8b qwen2.5-32b; do
    step 120 "profile $shape int8" sh -c "\"$BIN/dflash\" bench --synthetic $shape ${a[*]} --int8-activations true --prompt-tokens 64 --decode-tokens 64 > $RES/profile-$shape-int8.json"
  done
  step 120 "profile qwen3-8b dflash int8" sh -c "\"$BIN/dflash\" bench --synthetic qwen3-8b ${a[*]} --int8-activations true --drafter synthetic --limit 2 --prompt-tokens 64 --max-new-tokens 128 --block 16 --accept-profile $accept > $RES/profile-qwen3-8b-dflash-int8.json"
  # The qwen3-8b pair drafting among 8192 ids (a draft vocabulary) at the same acceptance.
  step 120 "profile qwen3-8b dflash draft-vocab" sh -c "\"$BIN/dflash\" bench --synthetic qwen3-8b ${a[*]} --drafter synthetic --synthetic-draft-vocab 8192 --limit 2 --prompt-tokens 64 --max-new-tokens 128 --block 16 --accept-profile $accept > $RES/profile-qwen3-8b-dflash-draft-vocab.json"
  # The same pair with the drafter's matrices in 8 bits (nearly twice its bytes per step of
  # the default 4).
  step 120 "profile qwen3-8b dflash q8 drafter" sh -c "\"$BIN/dflash\" bench --synthetic qwen3-8b ${a[*]} --drafter synthetic --drafter-precision q8 --synthetic-draft-vocab 8192 --limit 2 --prompt-tokens 64 --max-new-tokens 128 --block 16 --accept-profile $accept > $RES/profile-qwen3-8b-dflash-q8-drafter.json"
  # The mixture's verify cost: step_costs[16] / step_costs[1] of the 30B-A3B shape
  # (each of 16 rows picks 8 of 128 experts; `auto` sizes blocks by these costs).
  step 150 "moe qwen3-coder-30b-a3b" sh -c "\"$BIN/dflash\" bench --synthetic qwen3-coder-30b-a3b --adapter \"${ADAPTER:-NVIDIA}\" --json --drafter synthetic --limit 1 --prompt-tokens 64 --max-new-tokens 32 --block auto > $RES/bench-qwen3-coder-30b-a3b.json"
  step 90 "long context qwen3-8b" sh -c "\"$BIN/dflash\" bench --synthetic qwen3-8b --adapter \"${ADAPTER:-NVIDIA}\" --json --prompt-tokens 4096 --decode-tokens 32 > $RES/bench-qwen3-8b-p4096.json"
  # The norm split into the residual GEMVs against the prologue's walk over x on a wide
  # model (hidden 4096: the prologue reads 16 rows of it per GEMV workgroup at 16 rows).
  step 120 "profile qwen3-8b norm in residual" sh -c "\"$BIN/dflash\" bench --synthetic qwen3-8b ${a[*]} --norm-in-residual true --prompt-tokens 64 --decode-tokens 64 > $RES/profile-qwen3-8b-norm-in-residual.json"
}

# After scripts/train-gpu.sh in the same call: the new drafter ($TRAINED) against the
# committed one as scripts/run.sh measures them (chat20, 8 prompts x 64 tokens, T=0,
# blocks auto and 16) and on HumanEval prompts ($EVAL_PROMPTS, where given), then the
# profiles that matter most (SmolLM2's plain and DFlash steps, the synthetic qwen3-8b
# pair at the published acceptance), then `profile` and `tests` as far as the budget goes.
after_train() {
  local set drafter name accept=0.96,0.93,0.90,0.87,0.84,0.80,0.76,0.72,0.68,0.64,0.60,0.56,0.52,0.48,0.44
  local a=(--model "$MODEL" --adapter "${ADAPTER:-NVIDIA}" --temperature 0 --max-new-tokens "${TOKENS:-64}" --block auto,16 --json)
  local p=(--adapter "${ADAPTER:-NVIDIA}" --profile --json)
  [ -f "$MODEL" ] || log "after-train: no model here, the synthetic profiles and tests only"
  for set in "fixtures/prompts/chat20.jsonl chat" "${EVAL_PROMPTS:-} humaneval"; do
    [ -f "$MODEL" ] || break
    # shellcheck disable=SC2086
    set -- $set; [ $# -eq 2 ] && [ -f "$1" ] || continue
    for drafter in $(printf '%s\n' "$TRAINED" "$COMMITTED" | uniq); do
      name=trained; [ "$drafter" = "$COMMITTED" ] && name=committed
      step "${BENCH_LIMIT:-60}" "bench $name $2" sh -c "\"$BIN/dflash\" bench ${a[*]} --drafter $drafter --prompts $1 --limit 8 > $RES/bench-$name-$2-T0.jsonl"
    done
  done
  if [ -f "$MODEL" ]; then
    step 60 "profile smollm2 p64" sh -c "\"$BIN/dflash\" bench --model $MODEL ${p[*]} --prompt-tokens 64 --decode-tokens 64 > $RES/profile-smollm2-p64.json"
    step 90 "profile smollm2 dflash" sh -c "\"$BIN/dflash\" bench --model $MODEL ${p[*]} --drafter $TRAINED --prompts fixtures/prompts/chat20.jsonl --limit 4 --max-new-tokens 64 --block 16,auto > $RES/profile-smollm2-dflash.json"
  fi
  step 120 "profile qwen3-8b dflash" sh -c "\"$BIN/dflash\" bench --synthetic qwen3-8b ${p[*]} --drafter synthetic --limit 2 --prompt-tokens 64 --max-new-tokens 128 --block 16 --accept-profile $accept > $RES/profile-qwen3-8b-dflash.json"
  # The same pair on 8-bit activations with packed integer dot products (the 16-row
  # verify is compute-bound in f32 on an 8B model; aim: <= 1.2 one-row steps).
  step 120 "profile qwen3-8b dflash int8" sh -c "\"$BIN/dflash\" bench --synthetic qwen3-8b ${p[*]} --int8-activations true --drafter synthetic --limit 2 --prompt-tokens 64 --max-new-tokens 128 --block 16 --accept-profile $accept > $RES/profile-qwen3-8b-dflash-int8.json"
  [ ! -f "$MODEL" ] || step 60 "profile smollm2 p512" sh -c "\"$BIN/dflash\" bench --model $MODEL ${p[*]} --prompt-tokens 512 --decode-tokens 64 > $RES/profile-smollm2-p512.json"
  step 120 "profile qwen2.5-32b" sh -c "\"$BIN/dflash\" bench --synthetic qwen2.5-32b ${p[*]} --prompt-tokens 64 --decode-tokens 64 > $RES/profile-qwen2.5-32b.json"
  # Where the trainer left time (it failed, say): the whole profile, then the GPU tests.
  profile
  tests
}

case "${1:-}" in
  pack) pack "$2" ;;
  stash) mkdir -p "$DEV" && mv "$2"/* "$DEV"/ && ls -la "$DEV" ;;
  setup) setup ;;
  tests) tests ;;
  run) run ;;
  profile) profile ;;
  after-train) setup && after_train; cp "$RES/log.txt" "$BACK/log.txt"; bundle ;;
  all)
    BUDGET_S=${BUDGET_S:-470}; [ "$BUDGET_S" -le 540 ] || BUDGET_S=540; DEADLINE=$((SECONDS + BUDGET_S))
    setup && { profile; run; tests; }
    grep -E "rc=|skipped" "$RES/log.txt" | tail -40
    cp "$RES/log.txt" "$BACK/log.txt"; bundle
    ;;
  *) sed -n '2,/^set -uo/{/^#/p}' "$0"; exit 2 ;;
esac
