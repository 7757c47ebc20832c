#!/usr/bin/env bash
# Bytes one carried piece may hold so that a call of this workplace's device tool stays
# within what travels with it: 64 MiB in all for the working tree (tracked files and
# untracked ones git does not ignore) plus the carried paths. Prints 64 MiB minus the
# tree's size minus a margin (MARGIN, 4 MiB: room for a manifest, a log and
# a little growth), at most 40 MB. Used by device-check.sh and train-gpu.sh `pack` where
# PIECE is not set.
set -euo pipefail
cd "$(dirname "$0")/.."
# One du over every path (a tracked file deleted in the working tree is skipped).
tree=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1) || true
if ! [ "${tree:-}" -gt 0 ] 2>/dev/null; then
  echo "device-piece-size: could not measure the working tree" >&2
  exit 1
fi
piece=$((64 * 1024 * 1024 - tree - ${MARGIN:-$((4 * 1024 * 1024))}))
if [ "$piece" -lt $((4 * 1024 * 1024)) ]; then
  echo "device-piece-size: the working tree ($tree bytes) leaves no room for a carried piece" >&2
  exit 1
fi
echo $((piece < 40000000 ? piece : 40000000))
