#!/usr/bin/env python3
"""The lines a person reads from a `dflash bench --json` output (scripts/run.sh): where it
ran, and plain against DFlash decoding per block size (or the plain bench's speeds)."""
import json
import sys


def engine(r):
    cpu = r.get("cpu")
    if cpu:
        return f"the CPU engine ({cpu['kernel']}, {cpu['threads']} threads)"
    adapter = r.get("adapter") or "the GPU"
    if isinstance(adapter, dict):
        adapter = adapter.get("name", "the GPU")
    return f"the GPU engine on {adapter}"


def main(path):
    with open(path) as f:
        v = json.load(f)
    runs = v if isinstance(v, list) else [v]
    first = runs[0]
    print(f"{first.get('model', '')}: {engine(first)}")
    for r in runs:
        if "dflash_tok_s" in r:
            print(
                f"  block {r['block']}: plain {r['plain_tok_s']:.1f} tok/s, DFlash {r['dflash_tok_s']:.1f} tok/s, "
                f"speedup {r['speedup']:.2f}x, mean tau {r['mean_tau']:.2f}, lossless {str(r['lossless']).lower()}"
            )
        else:
            print(f"  plain decoding: prefill {r['prefill_tok_s']:.1f} tok/s, decode {r['decode_tok_s']:.1f} tok/s")
    print(f"the whole JSON: {path}")


if __name__ == "__main__":
    main(sys.argv[1])
