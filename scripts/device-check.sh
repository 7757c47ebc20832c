#!/usr/bin/env bash
# The real-GPU evidence in ONE call of this workplace's device tool, from a fresh, bare
# machine with a GPU but no Rust toolchain, no Vulkan loader and no network. Here, first:
#   scripts/device-check.sh pack DIR     build and strip `dflash` and the dflash-gpu test
#                                        binaries (as t_<name>) and take the Vulkan
#                                        loader's libraries out of Debian's packages
#                                        (libvulkan1, libglvnd0, ...: `apt-get download`,
#                                        `dpkg-deb -x`, nothing installed here) into one
#                                        xz stream, DIR/one/bins.tar.xz, with a manifest
#                                        (commit, sizes); the pack's size is checked
#                                        against what one call carries beside the working
#                                        tree (ONE_MAX, 29 MB, and device-piece-size.sh).
#                                        DIR inside the checkout and ignored by git
#                                        (.device-pack), so that the call can carry it.
#                                        WITH_MODEL=1 also cuts SmolLM2's GGUF into
#                                        DIR/model/pN pieces for the optional second flow.
# then ONE call, carrying [".device-pack/one"], timeout_s 540:
#   BUDGET_S=450 scripts/device-check.sh one .device-pack/one
# and back here: `tar xzf <files_at>/results.tar.gz -C device-out` (log.txt comes back
# beside it). `one` unpacks, puts the carried loader on LD_LIBRARY_PATH where the machine
# has none (WGPU_BACKEND=vulkan: never a GL fallback), checks that a Vulkan adapter named
# $ADAPTER is there, then runs the plan (`scripts/device-check.sh plan` prints it with
# each step's limit and their sum): the core GPU tests on fixtures (bit identity across
# 1/16 rows and prefill, GPU == CPU, lossless DFlash and DFlash2), the profiles of the
# synthetic smollm2-135m, qwen3-4b, qwen3-8b and qwen2.5-32b (the last by layers), the
# synthetic pairs' DFlash step costs and speedups at the published acceptance (Qwen3-4B
# and Qwen3-8B, HumanEval and MT-Bench), f32 against 8-bit activations, the mixture's
# verify cost, then the remaining GPU tests (browser limits, streamed loads, hybrids,
# z-lab conformance). Each step's limit is cut to what is left of BUDGET_S and a step
# with under 15 s left is skipped; results are bundled into $OUT/results.tar.gz after
# every step, so what finished comes back even if the call is cut.
#   scripts/device-check.sh dry-run      the same call here: pack, then `one` in a mount
#                                        namespace where the system's libvulkan.so.1 is
#                                        hidden (a missing carried library fails here as
#                                        it would there), on lavapipe, every step's command
#                                        run for real but shrunk (DRY=1: one layer per
#                                        synthetic shape, few tokens, the test binaries
#                                        listed and one test each); it also checks that
#                                        without the carried loader no adapter is found.
#                                        Log in device-out/dry-run.log.
# The optional second flow (the real SmolLM2 model, which does not fit one call): with
# WITH_MODEL=1 at pack, one call per piece, back to back within the 30 s the machine
# stays warm, `scripts/device-check.sh stash DIR/model/pN`, the last one followed by
#   scripts/device-check.sh stash DIR/model/pN && scripts/device-check.sh real DIR/one
# (`real`: the SmolLM2 benchmarks and profiles, the trained and a random drafter at
# each temperature and block, and the real-model tests). scripts/train-gpu.sh
# run-then-check carries DIR/bins (the same xz as DIR/one) and runs `after-train`.
# Knobs: BUDGET_S (450; 540 at most), ADAPTER (NVIDIA), SHAPES (qwen3-4b qwen3-8b
# qwen2.5-32b), LAYERS_32B (32 of qwen2.5-32b's 64 layers), TRAINED (the drafter the
# real-model steps use; the committed one), TOKENS (64), BLOCKS (2,4,8,16,auto), TEMPS
# ("0 0.8"), BENCH_LIMIT (100 s per real-model benchmark), EVAL_PROMPTS (after-train's
# second prompt set).
set -uo pipefail
cd "$(dirname "$0")/.."
DEV="${DEV:-/tmp/dflash-dev}"
RES="${RES:-$DEV/results}"
BACK="${OUT:-device-out}"
mkdir -p "$DEV" "$RES" "$BACK"; DEV=$(realpath "$DEV"); RES=$(realpath "$RES"); BACK=$(realpath "$BACK")
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}" DFLASH_CACHE="$DEV/cache" WGPU_BACKEND=vulkan
BIN="$DEV/bin"
MODEL="$DFLASH_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
# The dflash-gpu test binaries: on fixtures and synthetic models, then the real model.
CORE_TESTS="ops fused engine dflash"
MORE_TESTS="dflash_gpu stream_load synthetic moe hybrid zlab"
REAL_TESTS="real_models"
# What one call may carry beside the working tree (the issue's ~29 MB of 64 MiB).
ONE_MAX=${ONE_MAX:-29000000}
# The Vulkan loader and what NVIDIA's ICD links against, from Debian's packages.
GL_PACKAGES="libvulkan1 libglvnd0 libgl1 libglx0 libegl1 libgles2 libopengl0"
COMMITTED=drafters/smollm2-135m-instruct-dflash-b16
TRAINED="${TRAINED:-$COMMITTED}"
ADAPTER="${ADAPTER:-NVIDIA}"
DRY=${DRY:-0}
# NVIDIA's Vulkan driver where the container mounts it outside the loader's search path.
nv_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -n "${VK_DRIVER_FILES:-}" ] || [ ! -f "$nv_icd" ] || export VK_DRIVER_FILES="$nv_icd"
DEADLINE=$((SECONDS + ${BUDGET_S:-1000000}))
log() { echo "== [$SECONDS s] $*" | tee -a "$RES/log.txt"; }
bundle() {
  tar czf "$BACK/results.tmp" -C "$RES" . && mv "$BACK/results.tmp" "$BACK/results.tar.gz"
}
DONE_STEPS=""
PLAN_ONLY=${PLAN_ONLY:-0}
PLAN_SUM=0
step() { # limit-seconds name command...: a step that already ran (rc 0) is not run again
  local limit=$1 name=$2 left=$((DEADLINE - SECONDS - 5)); shift 2
  if [ "$PLAN_ONLY" = 1 ]; then
    PLAN_SUM=$((PLAN_SUM + limit)); printf '%5d s  %4d s  %s\n' "$limit" "$PLAN_SUM" "$name"; return
  fi
  case "$DONE_STEPS" in *"|$name|"*) log "$name: done already"; return ;; esac
  if [ "$left" -lt 15 ]; then
    log "$name: skipped, ${left} s left of the budget"; return
  fi
  [ "$DRY" = 1 ] && limit=$((2 * limit)) # lavapipe, not a GPU
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

# Debian's loader packages, unpacked (not installed) into $1/gl: the shared libraries only.
loader_libs() (
  set -e
  local dest=$1 debs o=()
  debs=$(mktemp -d)
  if [ "$(dpkg --print-architecture 2>/dev/null)" != amd64 ]; then
    mkdir -p /tmp/amd64/partial
    o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
    apt-get "${o[@]}" update -qq
  fi
  # shellcheck disable=SC2086
  (cd "$debs" && { apt-get "${o[@]}" download $GL_PACKAGES >/dev/null 2>&1 ||
    { apt-get "${o[@]}" update -qq && apt-get "${o[@]}" download $GL_PACKAGES >/dev/null; }; })
  mkdir -p "$debs/x" "$dest/gl"
  for f in "$debs"/*.deb; do dpkg-deb -x "$f" "$debs/x"; done
  find "$debs/x" -name '*.so*' \( -type f -o -type l \) -exec cp -a {} "$dest/gl/" \;
  [ -e "$dest/gl/libvulkan.so.1" ] || { echo "pack: no libvulkan.so.1 in $GL_PACKAGES" >&2; exit 1; }
  rm -rf "$debs"
)

pack() (
  set -e
  local dir=$1 tmp exe n room size
  cargo build --release --locked -p dflash-cli
  tmp=$(mktemp -d); mkdir -p "$tmp/bin"
  strip -o "$tmp/bin/dflash" target/release/dflash
  for exe in $(cargo test --release --locked -p dflash-gpu --no-run --message-format=json \
    | python3 -c 'import json, sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable")]'); do
    n=$(basename "$exe"); n=${n%-*}
    case " $CORE_TESTS $MORE_TESTS $REAL_TESTS " in *" $n "*) strip -o "$tmp/bin/t_$n" "$exe" ;; esac
  done
  for n in $CORE_TESTS $MORE_TESTS $REAL_TESTS; do
    [ -x "$tmp/bin/t_$n" ] || { echo "pack: no test binary $n" >&2; exit 1; }
  done
  loader_libs "$tmp"
  rm -rf "$dir" && mkdir -p "$dir/one"
  # xz -9: its 64 MiB window sees what the binaries share (about 10 MB against 25 at -6).
  tar cf - -C "$tmp" bin gl | xz -T0 -9 > "$dir/one/bins.tar.xz"
  rm -rf "$tmp"
  { echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo +changes)"
    echo "built $(date -u +%FT%TZ)"; ls -l "$dir/one/bins.tar.xz"; } > "$dir/one/manifest.txt"
  # The binaries for scripts/train-gpu.sh run-then-check (hard links).
  mkdir -p "$dir/bins" && ln "$dir/one/bins.tar.xz" "$dir/one/manifest.txt" "$dir/bins/"
  size=$(du -cb "$dir/one" | tail -1 | cut -f1)
  room=$(MARGIN=0 scripts/device-piece-size.sh)
  [ "$room" -le "$ONE_MAX" ] || room=$ONE_MAX
  echo "pack: $dir/one is $size bytes; one call carries $room beside the tree"
  [ "$size" -le "$room" ] || { echo "pack: $dir/one ($size bytes) does not fit one call ($room)" >&2; exit 1; }
  [ "${WITH_MODEL:-0}" = 1 ] && model_pieces "$dir"
  ls -la "$dir"/*
)

# SmolLM2's GGUF in pieces of what a call carries, for `stash` calls before `real`.
model_pieces() {
  local dir=$1 model piece f i
  model=$(scripts/fetch-models.sh smollm2)
  piece=${PIECE:-$(scripts/device-piece-size.sh)}
  mkdir -p "$dir/model"
  split -b "$piece" -d -a 2 "$model" "$dir/model/model.part"
  for f in "$dir"/model/model.part*; do
    i=$((10#${f##*.part})); mkdir -p "$dir/model/p$i"; mv "$f" "$dir/model/p$i/"
  done
  (cd "$(dirname "$model")" && sha256sum "$(basename "$MODEL")") > "$dir/model/p0/model.sha256"
}

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

# Whether the machine's own Vulkan loader is there (an empty file, as the dry run's
# hidden one, is not).
system_loader() {
  local p
  p=$(ldconfig -p 2>/dev/null | awk '/libvulkan\.so\.1 .*x86-64/ {print $NF; exit}')
  [ -n "$p" ] && [ -s "$(readlink -f "$p")" ]
}

setup() {
  if [ -f "$DEV/bins.tar.xz" ]; then
    # xz, or Python's lzma where the machine has no xz.
    if command -v xz >/dev/null; then xz -dc "$DEV/bins.tar.xz"; else
      python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$DEV/bins.tar.xz"
    fi | tar xf - -C "$DEV" && rm "$DEV/bins.tar.xz"
  fi
  [ -x "$BIN/dflash" ] || { log "setup: no binaries in $BIN"; return 1; }
  if system_loader; then
    log "setup: the machine's Vulkan loader"
  elif [ -e "$DEV/gl/libvulkan.so.1" ] && [ "${NO_CARRIED_LOADER:-0}" != 1 ]; then
    export LD_LIBRARY_PATH="$DEV/gl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    log "setup: the carried Vulkan loader ($DEV/gl)"
  else
    log "setup: no Vulkan loader here and none carried"
  fi
  join_model
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >>"$RES/log.txt" 2>&1
  "$BIN/dflash" adapters > "$RES/adapters.txt" 2>&1
  cat "$RES/adapters.txt" >> "$RES/log.txt"
  if ! grep -qi "$ADAPTER.*Vulkan" "$RES/adapters.txt"; then
    log "setup: no Vulkan adapter named $ADAPTER (WGPU_BACKEND=vulkan): $(tr '\n' ';' < "$RES/adapters.txt")"
    bundle; return 1
  fi
  log "setup: $(grep -i "$ADAPTER.*Vulkan" "$RES/adapters.txt" | head -1)"
}

# 15 conditional per-slot acceptances, each p, whose mean tau at block 16 is a published
# figure: 1 + p + p^2 + ... + p^15 = tau (DFlash on Qwen3-4B: HumanEval 6.72, MT-Bench
# 3.43, z-lab's SGLang runs; Qwen3-8B: HumanEval 6.55, MT-Bench 4.25, the paper's B200
# table; ../shared/notes/anchors.md and dflash.md).
uniform() { local p=$1 i s=$1; for i in $(seq 2 15); do s="$s,$p"; done; echo "$s"; }
declare -A ACCEPT=(
  [qwen3-4b-humaneval]=$(uniform 0.8661) [qwen3-4b-mtbench]=$(uniform 0.7097)
  [qwen3-8b-humaneval]=$(uniform 0.8613) [qwen3-8b-mtbench]=$(uniform 0.7682)
)

# A synthetic shape's arguments: every layer (qwen2.5-32b by LAYERS_32B); DRY: SmolLM2's
# shapes, one layer (`dry_shapes` checks the real ones' arguments).
shape() {
  if [ "$DRY" = 1 ]; then echo "--synthetic smollm2-135m --synthetic-layers 1"; return; fi
  real_shape "$1"
}
real_shape() {
  case $1 in
    qwen2.5-32b) echo "--synthetic $1 --synthetic-layers ${LAYERS_32B:-32}" ;;
    *) echo "--synthetic $1" ;;
  esac
}

# DRY: each real shape's plain and DFlash arguments refused by the memory plan (a typed
# error before anything is allocated): the names, layer counts and profiles parse.
dry_shapes() {
  local shape set out
  for shape in ${SHAPES:-qwen3-4b qwen3-8b qwen2.5-32b} qwen3-coder-30b-a3b; do
    for set in plain ${!ACCEPT[*]}; do
      case $set in plain) ;; "$shape"-*) ;; *) continue ;; esac
      local d=(); [ "$set" = plain ] || d=(--drafter synthetic --block 16 --accept-profile "${ACCEPT[$set]}")
      # shellcheck disable=SC2046
      out=$("$BIN/dflash" bench $(real_shape "$shape") --adapter "$ADAPTER" --json --memory-budget 1K "${d[@]}" 2>&1)
      echo "$shape $set: $out" | tail -1
      grep -q "bytes of GPU memory" <<<"$out" || return 1
    done
  done
}

# The GPU tests of one binary (DRY: listed, and ops' first test run on the GPU).
gpu_test() {
  local limit=$1 t=$2
  if [ "$DRY" = 1 ] && [ "$t" != ops ]; then
    step "$limit" "test $t" sh -c "\"$BIN/t_$t\" --list | tail -1"
  elif [ "$DRY" = 1 ]; then
    step "$limit" "test $t" sh -c "cd crates/dflash-gpu && DFLASH_REQUIRE_GPU=1 \"$BIN/t_$t\" --exact \"\$(\"$BIN/t_$t\" --list 2>/dev/null | grep ': test$' | head -1 | sed 's/: test$//')\""
  else
    step "$limit" "test $t" sh -c "cd crates/dflash-gpu && DFLASH_REQUIRE_GPU=1 \"$BIN/t_$t\" --test-threads 8"
  fi
}

# The one call's steps, most important first.
plan() {
  local a=(--adapter "$ADAPTER" --profile --json) shape set dt=64 mt=128 np=2
  [ "$DRY" = 1 ] && { dt=4; mt=4; np=1; }
  [ "$DRY" = 1 ] && step 60 "dry shapes" env DEV="$DEV" RES="$RES" ADAPTER="$ADAPTER" "$0" dry-shapes
  for t in $CORE_TESTS; do gpu_test 60 "$t"; done
  step 45 "profile smollm2-135m" sh -c "\"$BIN/dflash\" bench $(shape smollm2-135m) ${a[*]} --prompt-tokens 64 --decode-tokens $dt > $RES/profile-smollm2-135m.json"
  for shape in ${SHAPES:-qwen3-4b qwen3-8b qwen2.5-32b}; do
    step 45 "profile $shape" sh -c "\"$BIN/dflash\" bench $(shape "$shape") ${a[*]} --prompt-tokens 64 --decode-tokens $dt > $RES/profile-$shape.json"
    for set in humaneval mtbench; do
      [ -n "${ACCEPT[$shape-$set]:-}" ] || continue
      step 45 "dflash $shape $set" sh -c "\"$BIN/dflash\" bench $(shape "$shape") ${a[*]} --drafter synthetic --limit $np --prompt-tokens 64 --max-new-tokens $mt --block 16 --accept-profile ${ACCEPT[$shape-$set]} > $RES/dflash-$shape-$set.json"
    done
  done
  # GEMVs on 8-bit activations (packed integer dot products) against the f32 above.
  step 45 "profile qwen3-8b int8" sh -c "\"$BIN/dflash\" bench $(shape qwen3-8b) ${a[*]} --int8-activations true --prompt-tokens 64 --decode-tokens $dt > $RES/profile-qwen3-8b-int8.json"
  step 45 "dflash qwen3-8b humaneval int8" sh -c "\"$BIN/dflash\" bench $(shape qwen3-8b) ${a[*]} --int8-activations true --drafter synthetic --limit $np --prompt-tokens 64 --max-new-tokens $mt --block 16 --accept-profile ${ACCEPT[qwen3-8b-humaneval]} > $RES/dflash-qwen3-8b-humaneval-int8.json"
  # The mixture's verify cost: step_costs[16] / step_costs[1] (`auto` sizes blocks by them).
  step 60 "moe qwen3-coder-30b-a3b" sh -c "\"$BIN/dflash\" bench $(shape qwen3-coder-30b-a3b) --adapter \"$ADAPTER\" --json --drafter synthetic --limit 1 --prompt-tokens 64 --max-new-tokens 32 --block auto > $RES/bench-qwen3-coder-30b-a3b.json"
  for t in $MORE_TESTS; do gpu_test 45 "$t"; done
}

# The real model's steps (the optional second flow): benchmarks, profiles, tests.
real() {
  [ -f "$MODEL" ] || { log "real: no model here"; return 1; }
  local a=(--model "$MODEL" --adapter "$ADAPTER") p=(--adapter "$ADAPTER" --profile --json) drafter path t
  step 60 "bench plain" sh -c "\"$BIN/dflash\" bench ${a[*]} --prompt-tokens 512 --decode-tokens 128 --json > $RES/bench-plain.json"
  step 60 "profile smollm2 p64" sh -c "\"$BIN/dflash\" bench --model $MODEL ${p[*]} --prompt-tokens 64 --decode-tokens 64 > $RES/profile-smollm2-p64.json"
  step 90 "profile smollm2 dflash" sh -c "\"$BIN/dflash\" bench --model $MODEL ${p[*]} --drafter $TRAINED --prompts fixtures/prompts/chat20.jsonl --limit 4 --max-new-tokens 64 --block 16,auto > $RES/profile-smollm2-dflash.json"
  local d=(--prompts fixtures/prompts/chat20.jsonl --max-new-tokens "${TOKENS:-64}" --block "${BLOCKS:-2,4,8,16,auto}" --top-p 0.95 --seed 7 --json)
  step 60 "random drafter" "$BIN/dflash" make-random-drafter --model "$MODEL" --out "$DEV/random-drafter" --seed 1
  for drafter in trained random; do
    path=$TRAINED; [ "$drafter" = random ] && path="$DEV/random-drafter"
    for t in ${TEMPS:-0 0.8}; do
      step "${BENCH_LIMIT:-100}" "bench $drafter T=$t" sh -c "\"$BIN/dflash\" bench ${a[*]} --drafter $path --temperature $t ${d[*]} > $RES/bench-$drafter-T$t-n${TOKENS:-64}.jsonl"
    done
  done
  step 150 "test real_models" sh -c "cd crates/dflash-gpu && DFLASH_REQUIRE_GPU=1 DFLASH_REQUIRE_MODELS=1 \"$BIN/t_real_models\" --test-threads 4"
}

# After scripts/train-gpu.sh in the same call: the new drafter ($TRAINED) against the
# committed one as scripts/run.sh measures them (chat20, 8 prompts x 64 tokens, T=0,
# blocks auto and 16) and on HumanEval prompts ($EVAL_PROMPTS, where given), then the
# one call's plan as far as the budget goes.
after_train() {
  local set drafter name
  local a=(--model "$MODEL" --adapter "$ADAPTER" --temperature 0 --max-new-tokens "${TOKENS:-64}" --block auto,16 --json)
  [ -f "$MODEL" ] || log "after-train: no model here, the synthetic plan only"
  for set in "fixtures/prompts/chat20.jsonl chat" "${EVAL_PROMPTS:-} humaneval"; do
    [ -f "$MODEL" ] || break
    # shellcheck disable=SC2086
    set -- $set; [ $# -eq 2 ] && [ -f "$1" ] || continue
    for drafter in $(printf '%s\n' "$TRAINED" "$COMMITTED" | uniq); do
      name=trained; [ "$drafter" = "$COMMITTED" ] && name=committed
      step "${BENCH_LIMIT:-60}" "bench $name $2" sh -c "\"$BIN/dflash\" bench ${a[*]} --drafter $drafter --prompts $1 --limit 8 > $RES/bench-$name-$2-T0.jsonl"
    done
  done
  plan
}

finish() {
  grep -E "rc=|skipped|setup:" "$RES/log.txt" | tail -60
  cp "$RES/log.txt" "$BACK/log.txt"; bundle
}

# `one` here on lavapipe, with the system's loader hidden and every step shrunk.
dry_run() (
  set -e
  local dir=.device-pack dev=/tmp/dflash-dry lib log=device-out/dry-run.log
  mkdir -p device-out
  pack "$dir"
  lib=$(readlink -f "$(ldconfig -p | awk '/libvulkan\.so\.1 .*x86-64/ {print $NF; exit}')")
  [ -s "$lib" ] || { echo "dry-run: this machine has no Vulkan loader to hide" >&2; exit 1; }
  rm -rf "$dev"
  # The negative control: with the system's loader hidden and none carried, no adapter.
  unshare -m sh -c "mount --bind /dev/null '$lib' && DEV=$dev/ctl OUT=$dev/ctl-out NO_CARRIED_LOADER=1 ADAPTER=llvmpipe $0 setup-only $dir/one" \
    > "$dev.ctl.log" 2>&1 && { echo "dry-run: an adapter was found without any loader" >&2; exit 1; }
  grep -q "no Vulkan loader here and none carried" "$dev.ctl.log"
  echo "dry-run: without a loader, no adapter (as expected)"
  unshare -m sh -c "mount --bind /dev/null '$lib' && DEV=$dev OUT=$dev/out DRY=1 ADAPTER=llvmpipe BUDGET_S=${BUDGET_S:-450} $0 one $dir/one" 2>&1 | tee "$log"
  grep -q "setup: the carried Vulkan loader" "$log"
  if grep -E "rc=[1-9]|skipped" "$log"; then echo "dry-run: a step failed" >&2; exit 1; fi
  tar tzf "$dev/out/results.tar.gz" | sort | tee -a "$log"
  echo "dry-run: every step passed with the carried loader; pack $(du -cb "$dir/one" | tail -1 | cut -f1) bytes" | tee -a "$log"
)

case "${1:-}" in
  pack) pack "$2" ;;
  plan) PLAN_ONLY=1; echo "limit  total  step (BUDGET_S ${BUDGET_S:-450})"; plan ;;
  dry-run) dry_run ;;
  dry-shapes) dry_shapes ;;
  one)
    BUDGET_S=${BUDGET_S:-450}; [ "$BUDGET_S" -le 540 ] || BUDGET_S=540; DEADLINE=$((SECONDS + BUDGET_S))
    cp "$2"/* "$DEV"/
    log "one: $(head -1 "$DEV/manifest.txt"), budget $BUDGET_S s"
    setup && plan
    finish
    ;;
  setup-only) cp "$2"/* "$DEV"/; setup; rc=$?; finish >/dev/null; exit $rc ;;
  stash) mkdir -p "$DEV" && mv "$2"/* "$DEV"/ && ls -la "$DEV" ;;
  real) cp "$2"/* "$DEV"/; setup && real; finish ;;
  after-train) setup && after_train; finish ;;
  *) sed -n '2,/^set -uo/{/^#/p}' "$0"; exit 2 ;;
esac
