#!/usr/bin/env python3
"""Functions longer than N lines (default 80) under crates/*/src, and files longer than
900 lines: `scripts/long-functions.py [N]`. Counts from a `fn` line to its closing brace
on the formatted code (strings and comments with braces are rare enough to ignore)."""
import glob, re, sys

limit = int(sys.argv[1]) if len(sys.argv) > 1 else 80
FN = re.compile(r'^\s*(pub(\([^)]*\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?(extern\s+"C"\s+)?fn\s+(\w+)')
long_fns, long_files = [], []
for path in sorted(glob.glob('crates/*/src/**/*.rs', recursive=True)):
    lines = open(path).read().split('\n')
    if len(lines) > 900:
        long_files.append((len(lines), path))
    i = 0
    while i < len(lines):
        m = FN.match(lines[i])
        if not m:
            i += 1
            continue
        depth, j, opened = 0, i, False
        while j < len(lines):
            code = re.sub(r'"(\\.|[^"\\])*"|//.*', '', lines[j])
            depth += code.count('{') - code.count('}')
            opened |= '{' in code
            if (opened and depth <= 0) or (not opened and code.rstrip().endswith(';')):
                break
            j += 1
        n = j - i + 1
        if n > limit:
            long_fns.append((n, f"{path}:{i + 1}", m.group(7)))
        i += 1
for n, where, name in sorted(long_fns, reverse=True):
    print(f"{n:5} {where} {name}")
print(f"{len(long_fns)} functions over {limit} lines")
for n, path in sorted(long_files, reverse=True):
    print(f"{n:5} {path}")
print(f"{len(long_files)} files over 900 lines")
