#!/usr/bin/env python3
"""Import circles between files of each crate under crates/*/src.

A file imports another when it names an item through `crate::a::b` (in a `use` or in a
path in the code) or `super::...`, resolved to the deepest module file that exists. A
module's `pub use` of its own descendants (a facade's re-exports) and `mod` declarations
are not imports. Prints each circle (a strongly connected group of files) and exits 1 if
there is any; `--graph` prints every edge."""
import os, re, sys

def modules(src):
    mods = {}
    for root, _, files in os.walk(src):
        for f in files:
            if not f.endswith('.rs'):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, src)[:-3].split(os.sep)
            if rel[-1] in ('mod', 'lib', 'main'):
                rel = rel[:-1]
            mods[tuple(rel)] = path
    return mods

def resolve(mods, parts):
    for n in range(len(parts), -1, -1):
        if tuple(parts[:n]) in mods:
            return tuple(parts[:n])
    return None

USE = re.compile(r'^\s*(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);', re.M | re.S)
PATH = re.compile(r'\b(crate|super)((?:::\w+)+)')

def expand(tree):
    """`a::{b, c::{d}}` -> ['a::b', 'a::c::d'] (enough for module resolution)."""
    tree = re.sub(r'\s+', '', tree)
    m = re.match(r'^(.*?)\{(.*)\}$', tree)
    if not m:
        return [tree]
    prefix, inner = m.groups()
    parts, depth, cur = [], 0, ''
    for ch in inner:
        if ch == ',' and depth == 0:
            parts.append(cur); cur = ''
            continue
        depth += ch == '{'
        depth -= ch == '}'
        cur += ch
    parts.append(cur)
    return [x for p in parts if p for x in expand(prefix + p)]

def edges(mods, me, text):
    out = set()
    # Test modules may reach anywhere (they are not part of the layering).
    text = re.split(r'#\[cfg\(test\)\]', text)[0]
    text = re.sub(r'//[^\n]*', '', text)  # comments (and doc comments) name, not import
    body = USE.sub(lambda m: '', text)
    uses = [(bool(m.group(1)), p) for m in USE.finditer(text) for p in expand(m.group(2))]
    paths = [(False, m.group(1) + m.group(2)) for m in PATH.finditer(body)]
    for public, p in uses + paths:
        segs = p.split('::')
        if segs[0] == 'crate':
            target = list(segs[1:])
        elif segs[0] == 'super':
            base = list(me)
            while segs and segs[0] == 'super':
                base = base[:-1]
                segs = segs[1:]
            target = base + segs
        elif segs[0] == 'self':
            target = list(me) + segs[1:]
        else:
            continue
        t = resolve(mods, target)
        if t is None or t == me:
            continue
        if public and t[:len(me)] == me:
            continue  # a facade re-exporting its own descendant
        out.add(t)
    return out

def sccs(graph):
    index, low, stack, on, res, i = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = i[0]; i[0] += 1
        stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                res.append(comp)
    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return res

def main():
    show = '--graph' in sys.argv
    bad = 0
    for crate in sorted(os.listdir('crates')):
        src = os.path.join('crates', crate, 'src')
        if not os.path.isdir(src):
            continue
        mods = modules(src)
        graph = {m: edges(mods, m, open(p).read()) for m, p in mods.items()}
        if show:
            for m, ts in sorted(graph.items()):
                for t in sorted(ts):
                    print(f"{crate}: {'::'.join(m) or 'lib'} -> {'::'.join(t) or 'lib'}")
        for comp in sccs(graph):
            bad += 1
            names = sorted(os.path.relpath(mods[m], src) for m in comp)
            print(f"{crate}: circle of {len(names)}: {' <-> '.join(names)}")
    print(f"{bad} import circle(s)")
    sys.exit(1 if bad else 0)

main()
