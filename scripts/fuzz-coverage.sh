#!/usr/bin/env bash
# Coverage-guided fuzzing (cargo-fuzz, libFuzzer, on nightly) of every parser a request
# or a file reaches: GGUF headers and whole GGUF loads, safetensors headers, config.json,
# tokenizer.json, drafter configs, the GGUF tokenizer, chat templates, the request
# parser, grammars (JSON schemas, regexes, Lark) and tool-call parsing. The targets and
# seeds are dflash-fuzz's (fuzz/, crates/dflash-fuzz/src/targets.rs); the corpus grows
# in fuzz/corpus/ (not in git) and a run resumes from it.
#
#   scripts/fuzz-coverage.sh [TARGET...]     RUNS=1000000 (executions per target)
#
# One JSON line per target in results/fuzz-coverage-COMMIT.jsonl: executions, seconds,
# coverage (libFuzzer's edges), corpus size, peak RSS, and the crash, leak, timeout or
# out-of-memory it found (the input kept in fuzz/artifacts/TARGET/). Exits 1 on any.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-1000000}
ALL=(gguf_header gguf_load safetensors config_json tokenizer_json drafter_config gguf_tokenizer
  chat_template request grammar tool_calls)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${ALL[@]}")
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cargo build --release --locked -p dflash-fuzz
seeds=target/fuzz-seeds
rm -rf "$seeds"
target/release/dflash-fuzz --dump-seeds "$seeds"
# Each libFuzzer target's seeds: its file of each of dflash-fuzz's seeds.
declare -A SOURCE=(
  [gguf_header]=gguf-header/header [gguf_load]=gguf-load/model.gguf
  [safetensors]=hf-folder/model.safetensors [config_json]=hf-folder/config.json
  [tokenizer_json]=hf-folder/tokenizer.json [drafter_config]=drafter/config.json
  [gguf_tokenizer]=tokenizer/header [chat_template]=chat-template/template
  [request]=request/request.json [grammar]=grammar/grammar [tool_calls]=tool-calls/text
)
commit=$(git rev-parse --short HEAD)
out=results/fuzz-coverage-$commit.jsonl
failed=0
for t in "${targets[@]}"; do
  src=${SOURCE[$t]}
  corpus=fuzz/corpus/$t
  mkdir -p "$corpus" "fuzz/artifacts/$t"
  for f in "$seeds/${src%/*}"/*/"${src#*/}"; do
    [ -f "$f" ] && cp "$f" "$corpus/seed-$(sha256sum "$f" | cut -c1-16)"
  done
  log=target/fuzz-$t.log
  start=$SECONDS
  # No sanitizer: safe Rust; what is sought is a panic, an abort, a hang or runaway memory.
  status=0
  (cd fuzz && cargo +nightly fuzz run --sanitizer none "$t" "corpus/$t" -- \
    -runs="$RUNS" -max_len=262144 -timeout=20 -rss_limit_mb=4096 -malloc_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="artifacts/$t/") >"$log" 2>&1 || status=$?
  python3 - "$t" "$log" "$status" "$((SECONDS - start))" "$commit" >>"$out" <<'EOF'
import json, re, sys
t, log, status, seconds, commit = sys.argv[1], open(sys.argv[2], errors="replace").read(), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
def stat(name):
    m = re.findall(rf"stat::{name}:\s+(\d+)", log)
    return int(m[-1]) if m else None
cov = re.findall(r"cov: (\d+)", log)
corp = re.findall(r"corp: (\d+)/", log)
found = re.findall(r"(deadly signal|panicked at [^\n]*|ERROR: libFuzzer: [^\n]*|Test unit written to [^\n]*)", log)
print(json.dumps({"target": t, "commit": commit, "executions": stat("number_of_executed_units"),
                  "seconds": seconds, "exec_per_s": stat("average_exec_per_sec"), "coverage_edges": int(cov[-1]) if cov else None,
                  "corpus": int(corp[-1]) if corp else None, "peak_rss_mb": stat("peak_rss_mb"),
                  "exit": status, "findings": found[:6]}))
EOF
  tail -1 "$out"
  [ "$status" -eq 0 ] || failed=1
done
exit $failed
