#!/usr/bin/env bash
# The real-GPU checks, for a machine with a GPU but no Rust toolchain and no network
# (the lent device machine of this workplace): prebuilt, stripped binaries are carried
# in (`dflash` and the dflash-gpu test binaries, as `t_<name>`), the default model in
# pieces when one transfer cannot hold it. Here, first:
#   scripts/device-check.sh pack DIR         build and strip the binaries into DIR/p0/,
#                                            cut the model into DIR/p1/, DIR/p2/, ... of
#                                            at most $PIECE bytes (40 MB): one per transfer
# (DIR inside the checkout and ignored by git, e.g. .device-pack, so that it can be
# carried), then on the machine, each step a separate call carrying DIR/pN (and .gl/,
# the Debian packages of the Vulkan loader, `apt-get download libvulkan1`, where the
# machine has none):
#   scripts/device-check.sh stash DIR        move DIR's files (pieces, bins.tar.xz) to $DEV
#   scripts/device-check.sh setup            unpack the binaries, list adapters, run the
#                                            GPU tests on the synthetic models
#   scripts/device-check.sh run SHA256       join the model's pieces, check its sha256, run
#                                            the real-model GPU tests and the benchmarks
#   scripts/device-check.sh profile         the engine profile (no model file needed for
#                                            the synthetic shapes): `dflash bench --profile`
#                                            of SmolLM2 at 64 and 512 prompt tokens, of its
#                                            DFlash step, plain decode greedy and at T=0.8,
#                                            the Intel Xe2 tuning entry, one GEMV row per
#                                            thread against the table's, and of the
#                                            synthetic qwen3-8b and qwen2.5-32b pairs, with
#                                            their DFlash runs at the published acceptance
#                                            (--accept-profile; qwen3-8b's also drafting
#                                            among 8192 ids), and the measured step costs
#                                            (16-row verify against one row) of the
#                                            synthetic qwen3-coder-30b-a3b mixture
# Knobs: TESTS=0 skips the tests (and the plain benchmark); TOKENS (64), BLOCKS
# (2,4,8,16,auto), DRAFTERS ("trained random"), TEMPS ("0 0.8") and BENCH_LIMIT (100 s
# per benchmark) shape the DFlash benchmarks; SHAPES ("qwen3-8b qwen2.5-32b") the
# synthetic profiles.
# Everything is logged to $OUT (default ./device-out). Each step has a time limit and
# the run goes on after a failure, so one call brings back everything that worked.
set -uo pipefail
cd "$(dirname "$0")/.."
DEV="${DEV:-/tmp/dflash-dev}"
OUT="${OUT:-device-out}"
mkdir -p "$DEV" "$OUT"; OUT=$(realpath "$OUT")
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}" DFLASH_CACHE="$DEV/cache"
BIN="$DEV/bin"
# NVIDIA's Vulkan driver where the container mounts it outside the loader's search path.
nv_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -n "${VK_DRIVER_FILES:-}" ] || [ ! -f "$nv_icd" ] || export VK_DRIVER_FILES="$nv_icd"
log() { echo "== [$SECONDS s] $*" | tee -a "$OUT/log.txt"; }
step() { # limit-seconds name command...
  local limit=$1 name=$2; shift 2
  log "$name: $*"
  timeout "$limit" "$@" >>"$OUT/log.txt" 2>&1
  local rc=$?
  log "$name: rc=$rc"
}

# The test binaries read fixtures at the path of the checkout they were built in.
built_in="${BUILT_IN:-/work/main}"
if [ ! -e "$built_in/Cargo.toml" ]; then
  mkdir -p "$(dirname "$built_in")" && ln -sfn "$PWD" "$built_in"
fi

case "${1:-}" in
  pack)
    dir=$2; model=$(scripts/fetch-models.sh smollm2)
    cargo build --release --locked -p dflash-cli
    tmp=$(mktemp -d); mkdir -p "$tmp/bin" "$dir/p0"
    strip -o "$tmp/bin/dflash" target/release/dflash
    cargo test --release --locked -p dflash-gpu --no-run --message-format=json \
      | python3 -c 'import json, sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("executable")]' \
      | while read -r exe; do n=$(basename "$exe"); strip -o "$tmp/bin/t_${n%-*}" "$exe"; done
    tar cJf "$dir/p0/bins.tar.xz" -C "$tmp" bin && rm -rf "$tmp"
    split -b "${PIECE:-40000000}" -d -a 2 "$model" "$dir/model.part"
    i=1; for f in "$dir"/model.part*; do mkdir -p "$dir/p$i"; mv "$f" "$dir/p$i/"; i=$((i + 1)); done
    ls -la "$dir"/p*; echo "sha256: $(sha256sum "$model" | cut -d' ' -f1)"
    ;;
  stash)
    mv "$2"/* "$DEV"/
    ls -la "$DEV" | tee -a "$OUT/log.txt"
    ;;
  setup)
    # The Vulkan loader, carried as Debian packages in .gl/ where the machine has none.
    if ! ldconfig -p | grep -q libvulkan.so.1 && ls .gl/*.deb >/dev/null 2>&1; then
      for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
    fi
    if [ -f "$DEV/bins.tar.xz" ]; then
      mkdir -p "$BIN" && tar xJf "$DEV/bins.tar.xz" -C "$BIN" --strip-components=1 && rm "$DEV/bins.tar.xz"
    fi
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >>"$OUT/log.txt" 2>&1
    step 60 adapters "$BIN/dflash" adapters
    export DFLASH_REQUIRE_GPU=1
    [ "${TESTS:-1}" = 0 ] && exit 0
    for t in dflash_gpu ops fused engine dflash stream_load synthetic moe; do
      (cd crates/dflash-gpu && step 90 "test $t" "$BIN/t_$t" --test-threads 8)
    done
    grep -E "^test result|panicked|FAILED" "$OUT/log.txt" | tail -20
    ;;
  run)
    model="$DFLASH_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    mkdir -p "$(dirname "$model")"
    if [ ! -f "$model" ]; then
      cat "$DEV"/model.part* > "$model" && rm -f "$DEV"/model.part*
    fi
    if ! echo "$2  $model" | sha256sum -c --status; then
      log "sha256 mismatch for $model"; ls -la "$DEV" "$(dirname "$model")" | tee -a "$OUT/log.txt"; exit 1
    fi
    export DFLASH_REQUIRE_GPU=1 DFLASH_REQUIRE_MODELS=1
    a=(--model "$model" --adapter "${ADAPTER:-NVIDIA}")
    [ "${TESTS:-1}" = 0 ] || (cd crates/dflash-gpu && step 150 "test real_models" "$BIN/t_real_models" --test-threads 4)
    [ "${TESTS:-1}" = 0 ] || step 60 "bench plain" sh -c "\"$BIN/dflash\" bench ${a[*]} --prompt-tokens 512 --decode-tokens 128 --json > $OUT/bench-plain.json"
    d=(--prompts fixtures/prompts/chat20.jsonl --max-new-tokens "${TOKENS:-64}" --block "${BLOCKS:-2,4,8,16,auto}" --top-p 0.95 --seed 7 --json)
    trained=drafters/smollm2-135m-instruct-dflash-b16
    "$BIN/dflash" make-random-drafter --model "$model" --out "$DEV/random-drafter" --seed 1 >>"$OUT/log.txt" 2>&1
    for drafter in ${DRAFTERS:-trained random}; do
      path=$trained; [ $drafter = random ] && path="$DEV/random-drafter"
      for t in ${TEMPS:-0 0.8}; do
        step "${BENCH_LIMIT:-100}" "bench $drafter T=$t" sh -c "\"$BIN/dflash\" bench ${a[*]} --drafter $path --temperature $t ${d[*]} > $OUT/bench-$drafter-T$t-n${TOKENS:-64}.jsonl"
      done
    done
    grep -E "^test result|panicked|FAILED|rc=" "$OUT/log.txt" | tail -20
    ;;
  profile)
    # Everything here prints JSON under $OUT; the synthetic shapes need no model file.
    model="$DFLASH_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    a=(--adapter "${ADAPTER:-NVIDIA}" --profile --json)
    if [ -f "$model" ]; then
      for p in 64 512; do
        step 60 "profile smollm2 p$p" sh -c "\"$BIN/dflash\" bench --model $model ${a[*]} --prompt-tokens $p --decode-tokens 64 > $OUT/profile-smollm2-p$p.json"
      done
      # Sampling against greedy (aim: T=0.8 within 10%), plain decode as generation does it.
      for t in 0 0.8; do
        step 40 "bench smollm2 T=$t" sh -c "\"$BIN/dflash\" bench --model $model --adapter \"${ADAPTER:-NVIDIA}\" --json --prompt-tokens 64 --decode-tokens 128 --temperature $t --top-p 0.95 > $OUT/bench-smollm2-T$t.json"
      done
      # The Intel Xe2 entry of the tuning table on this GPU (its lanes per shape).
      step 60 "profile smollm2 p64 intel-xe2" sh -c "\"$BIN/dflash\" bench --model $model ${a[*]} --tuning intel-xe2 --prompt-tokens 64 --decode-tokens 64 > $OUT/profile-smollm2-p64-intel-xe2.json"
      # One output row per GEMV thread against the table's 4 (the 16-row step's cost).
      step 60 "profile smollm2 p64 outs1" sh -c "\"$BIN/dflash\" bench --model $model ${a[*]} --gemv-outputs 1 --prompt-tokens 64 --decode-tokens 64 > $OUT/profile-smollm2-p64-outs1.json"
      # The RMSNorm apart against fused into the next GEMV (the GPU tuning's default).
      step 40 "profile smollm2 p64 norm apart" sh -c "\"$BIN/dflash\" bench --model $model ${a[*]} --fuse-norm false --prompt-tokens 64 --decode-tokens 64 > $OUT/profile-smollm2-p64-norm-apart.json"
      # DFlash steps pipelined (the GPU tuning's default) against one at a time, same run
      # settings (the host's read-back latency per step is what pipelining hides).
      for piped in true false; do
        step 40 "bench smollm2 dflash pipelined=$piped" sh -c "\"$BIN/dflash\" bench --model $model --adapter \"${ADAPTER:-NVIDIA}\" --json --pipelined $piped --drafter drafters/smollm2-135m-instruct-dflash-b16 --prompts fixtures/prompts/chat20.jsonl --limit 4 --max-new-tokens 64 --block 4,16,auto > $OUT/bench-smollm2-dflash-pipelined-$piped.json"
      done
      step 90 "profile smollm2 dflash" sh -c "\"$BIN/dflash\" bench --model $model ${a[*]} --drafter drafters/smollm2-135m-instruct-dflash-b16 --prompts fixtures/prompts/chat20.jsonl --limit 4 --max-new-tokens 64 --block 16,auto > $OUT/profile-smollm2-dflash.json"
      # The same with the drafts over the whole vocabulary (the drafter's draft_vocab.json off).
      step 60 "profile smollm2 dflash full head" sh -c "\"$BIN/dflash\" bench --model $model ${a[*]} --drafter drafters/smollm2-135m-instruct-dflash-b16 --draft-vocab false --prompts fixtures/prompts/chat20.jsonl --limit 4 --max-new-tokens 64 --block 16,auto > $OUT/profile-smollm2-dflash-full-head.json"
    fi
    # Conditional per-slot acceptance with mean tau 6.5 at block 16 (z-lab's published
    # DFlash figure for Qwen3-8B on HumanEval; the per-slot shape is ours).
    accept=0.96,0.93,0.90,0.87,0.84,0.80,0.76,0.72,0.68,0.64,0.60,0.56,0.52,0.48,0.44
    for shape in ${SHAPES:-qwen3-8b qwen2.5-32b}; do
      step 120 "profile $shape" sh -c "\"$BIN/dflash\" bench --synthetic $shape ${a[*]} --prompt-tokens 64 --decode-tokens 64 > $OUT/profile-$shape.json"
      step 120 "profile $shape outs1" sh -c "\"$BIN/dflash\" bench --synthetic $shape ${a[*]} --gemv-outputs 1 --prompt-tokens 64 --decode-tokens 64 > $OUT/profile-$shape-outs1.json"
      step 120 "profile $shape dflash" sh -c "\"$BIN/dflash\" bench --synthetic $shape ${a[*]} --drafter synthetic --limit 2 --prompt-tokens 64 --max-new-tokens 128 --block 16 --accept-profile $accept > $OUT/profile-$shape-dflash.json"
    done
    # The qwen3-8b pair drafting among 8192 ids (a draft vocabulary) at the same acceptance.
    step 120 "profile qwen3-8b dflash draft-vocab" sh -c "\"$BIN/dflash\" bench --synthetic qwen3-8b ${a[*]} --drafter synthetic --synthetic-draft-vocab 8192 --limit 2 --prompt-tokens 64 --max-new-tokens 128 --block 16 --accept-profile $accept > $OUT/profile-qwen3-8b-dflash-draft-vocab.json"
    # The same pair with the drafter's matrices in 8 bits (nearly twice its bytes per step of
    # the default 4).
    step 120 "profile qwen3-8b dflash q8 drafter" sh -c "\"$BIN/dflash\" bench --synthetic qwen3-8b ${a[*]} --drafter synthetic --drafter-precision q8 --synthetic-draft-vocab 8192 --limit 2 --prompt-tokens 64 --max-new-tokens 128 --block 16 --accept-profile $accept > $OUT/profile-qwen3-8b-dflash-q8-drafter.json"
    # The mixture's verify cost: step_costs[16] / step_costs[1] of the 30B-A3B shape
    # (each of 16 rows picks 8 of 128 experts; `auto` sizes blocks by these costs).
    step 150 "moe qwen3-coder-30b-a3b" sh -c "\"$BIN/dflash\" bench --synthetic qwen3-coder-30b-a3b --adapter \"${ADAPTER:-NVIDIA}\" --json --drafter synthetic --limit 1 --prompt-tokens 64 --max-new-tokens 32 --block auto > $OUT/bench-qwen3-coder-30b-a3b.json"
    step 90 "long context qwen3-8b" sh -c "\"$BIN/dflash\" bench --synthetic qwen3-8b --adapter \"${ADAPTER:-NVIDIA}\" --json --prompt-tokens 4096 --decode-tokens 32 > $OUT/bench-qwen3-8b-p4096.json"
    grep -E "rc=" "$OUT/log.txt" | tail -20
    ;;
  *) sed -n '2,/^set -uo/{/^#/p}' "$0"; exit 2 ;;
esac
