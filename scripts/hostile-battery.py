#!/usr/bin/env python3
"""Bad inputs against the dflash CLI, as a user would give them (issue 18's battery).

Each case runs `target/release/dflash` in a child process with a time limit and an
address-space limit, and is counted as
  - error: a clean typed error (nonzero exit, a message on stderr, no panic);
  - ran:   it ran to the end (the input was odd but valid);
  - unclean: a panic, a signal (SIGBUS, SIGSEGV, SIGABRT), a hang past the time limit,
    or a peak RSS over the runaway limit.
Categories: malformed GGUF (mutations of the tests' tiny models), mutated SmolLM2
(header bit flips, retyped tensors, truncations), Hugging Face folders, drafter folders,
CLI arguments, prompt files, a model file truncated while it loads, and the commands
that write files (`dflash make-random-drafter`, `dflash-train data`, `train`,
`draft-vocab`, `export`, `serving-files`) given sizes past any machine.

  scripts/hostile-battery.py [--out results/hostile-battery.json] [--seed 1]
  scripts/hostile-battery.py --quick       # CI's short form: every category, one case in 6

Needs target/release/dflash, dflash-train and dflash-fuzz (cargo build --release -p
dflash-cli -p dflash-train -p dflash-fuzz); the SmolLM2 cases need
scripts/fetch-models.sh smollm2.
"""
import argparse
import json
import os
import random
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DFLASH = ROOT / "target/release/dflash"
FUZZ = ROOT / "target/release/dflash-fuzz"
TRAIN = ROOT / "target/release/dflash-train"
CACHE = Path(os.environ.get("DFLASH_CACHE", Path.home() / ".cache/dflash"))
SMOLLM2 = CACHE / "models/SmolLM2-135M-Instruct.Q4_1.gguf"
TIME_LIMIT_S = 60
ADDRESS_LIMIT = 16 << 30
RUNAWAY_RSS = 4 << 30
INTERESTING = [0, 1, 7, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
               1 << 32, 1 << 40, (1 << 64) - 1]


def run(args, during=None):
    """Runs dflash with `args`; `during(proc)` runs while it does. -> (outcome, detail)."""
    def limits():
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_LIMIT, ADDRESS_LIMIT))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    env = {**os.environ, "XDG_RUNTIME_DIR": os.environ.get("XDG_RUNTIME_DIR", "/tmp"), "RUST_BACKTRACE": "0"}
    t0 = time.time()
    exe, args = (TRAIN, args[1:]) if args and args[0] == "dflash-train" else (DFLASH, args)
    p = subprocess.Popen([str(exe), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, preexec_fn=limits, env=env)
    if during:
        try:
            during(p)
        except BaseException:
            p.kill()
            raise
    errors = []
    reader = threading.Thread(target=lambda: errors.append(p.stderr.read()))
    reader.start()
    # wait4 gives this child's own peak RSS (RUSAGE_CHILDREN is the largest child's so far).
    timer_hit = False
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.time() - t0 > TIME_LIMIT_S:
            p.kill()
            pid, status, usage = os.wait4(p.pid, 0)
            timer_hit = True
            break
        time.sleep(0.02)
    p.returncode = os.waitstatus_to_exitcode(status)
    reader.join()
    err = errors[0] if errors else b""
    rss = usage.ru_maxrss * 1024
    err = err.decode("utf-8", "replace")
    took = time.time() - t0
    if timer_hit:
        return "unclean", f"hang: over {TIME_LIMIT_S} s"
    if p.returncode < 0:
        return "unclean", f"signal {signal.Signals(-p.returncode).name}: {err[-300:]}"
    if "panicked" in err or "memory allocation of" in err:
        return "unclean", f"panic: {err[-300:]}"
    if rss > RUNAWAY_RSS:
        return "unclean", f"peak RSS {rss >> 20} MiB"
    if p.returncode == 0:
        return "ran", f"{took:.1f} s"
    if not err.strip():
        return "unclean", f"exit {p.returncode} without a message"
    return "error", err.strip().splitlines()[-1][:200]


def generate(model, *extra):
    return ["generate", "--model", str(model), "--prompt", "Hello", "--max-new-tokens", "2", "--device", "cpu", *extra]


def mutate_bytes(rng, b, header_end=None):
    b = bytearray(b)
    end = header_end or len(b)
    for _ in range(rng.randint(1, 4)):
        k = rng.randrange(5)
        at = rng.randrange(max(end, 1))
        if k == 0:
            b[at] ^= 1 << rng.randrange(8)
        elif k == 1 and at + 8 <= len(b):
            width = rng.choice([1, 2, 4, 8])
            v = rng.choice(INTERESTING) & ((1 << (8 * width)) - 1)
            b[at:at + width] = v.to_bytes(width, "little")
        elif k == 2:
            del b[at:at + rng.randint(1, 64)]
        elif k == 3:
            b[at:at] = b[at:at + rng.randint(1, 256)]
        else:
            b[at] = rng.randrange(256)
    return bytes(b)


# ---- GGUF structure, enough to find the tensor table ------------------------------

SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def gguf_layout(b):
    """-> (tensor entries [(type_at, offset_at)], data offset estimate)."""
    pos = 8
    n_tensors, n_kv = struct.unpack_from("<QQ", b, pos)
    pos += 16

    def string(p):
        n = struct.unpack_from("<Q", b, p)[0]
        return p + 8 + n

    def value(p, t):
        if t in SCALAR:
            return p + SCALAR[t]
        if t == 8:
            return string(p)
        if t == 9:
            it, n = struct.unpack_from("<IQ", b, p)
            p += 12
            if it in SCALAR:
                return p + SCALAR[it] * n
            for _ in range(n):
                p = value(p, it)
            return p
        raise ValueError(t)

    for _ in range(n_kv):
        pos = string(pos)
        t = struct.unpack_from("<I", b, pos)[0]
        pos = value(pos + 4, t)
    entries = []
    for _ in range(n_tensors):
        pos = string(pos)
        n_dims = struct.unpack_from("<I", b, pos)[0]
        pos += 4 + 8 * n_dims
        entries.append((pos, pos + 4))
        pos += 12
    return entries, pos


# ---- the categories -----------------------------------------------------------------

def malformed_gguf(rng, work, seeds):
    tiny = sorted((seeds / "gguf-load").glob("*/model.gguf"))
    for i in range(600):
        src = tiny[i % len(tiny)].read_bytes()
        f = work / f"tiny-{i}.gguf"
        f.write_bytes(mutate_bytes(rng, src))
        yield f"tiny #{i}", generate(f), None


def mutated_smollm2(rng, work):
    if not SMOLLM2.exists():
        return
    head = SMOLLM2.read_bytes()[:16 << 20]
    entries, table_end = gguf_layout(head)
    f = work / "smollm2.gguf"

    def write(header, cut=None):
        with open(SMOLLM2, "rb") as src, open(f, "wb") as dst:
            dst.write(header)
            src.seek(len(head))
            if cut is None:
                shutil.copyfileobj(src, dst, 16 << 20)
        if cut is not None:
            os.truncate(f, cut)

    cases = []
    for i in range(120):  # bit flips and edge values in the tensor table
        lo = entries[0][0] - 64
        b = bytearray(head)
        at = rng.randrange(lo, table_end)
        b[at] ^= 1 << rng.randrange(8)
        cases.append((f"table flip @{at}", bytes(b), None))
    for i in range(90):  # anywhere in the metadata and table
        cases.append((f"header mutation #{i}", mutate_bytes(rng, head, table_end), None))
    for t in [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 29, 30, 31, 99, 0xFFFFFFFF]:
        b = bytearray(head)
        type_at, _ = entries[rng.randrange(len(entries))]
        b[type_at:type_at + 4] = struct.pack("<I", t)
        cases.append((f"retyped to {t}", bytes(b), None))
    for k in range(4):  # aliased offsets
        b = bytearray(head)
        _, off_at = entries[rng.randrange(len(entries))]
        _, other = entries[rng.randrange(len(entries))]
        b[off_at:off_at + 8] = b[other:other + 8]
        cases.append((f"aliased offset #{k}", bytes(b), None))
    size = SMOLLM2.stat().st_size
    for cut in [0, 3, 8, 24, 1000, table_end // 2, table_end, table_end + 100, size // 2, size - 1]:
        cases.append((f"truncated to {cut}", head, cut))
    for name, header, cut in cases:
        yield name, generate(f), (lambda h=header, c=cut: write(h, c))


def hf_folders(rng, work, seeds):
    seed = seeds / "hf-folder/0"
    config = json.loads((seed / "config.json").read_text())
    values = [0, -1, 1 << 40, 1e308, "x", None, [], 0.5]
    cases = []
    for key in [k for k, v in config.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]:
        for v in values:
            cases.append((f"config {key}={v!r}", {"config.json": json.dumps({**config, key: v})}))
    for name in sorted(p.name for p in seed.iterdir()):
        cases.append((f"no {name}", {name: None}))
    st = (seed / "model.safetensors").read_bytes()
    cases.append(("safetensors truncated", {"model.safetensors": st[: len(st) // 2]}))
    cases.append(("safetensors header length 2^63", {"model.safetensors": struct.pack("<Q", 1 << 63) + st[8:]}))
    cases.append(("safetensors header garbage", {"model.safetensors": st[:8] + b"\xff" * 64 + st[72:]}))
    for path in ["/etc/passwd", "../model.safetensors", "sub/../../x.safetensors"]:
        idx = {"weight_map": {"model.embed_tokens.weight": path}}
        cases.append((f"index names {path}", {"model.safetensors.index.json": json.dumps(idx)}))
    cases.append(("tokenizer.json garbage", {"tokenizer.json": "{\"model\": 5"}))
    cases.append(("config not json", {"config.json": "\u0000\u0001"}))
    for i, (name, changes) in enumerate(cases):
        d = work / f"hf-{i}"

        def make(d=d, changes=changes):
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(seed, d)
            for fname, content in changes.items():
                if content is None:
                    (d / fname).unlink(missing_ok=True)
                elif isinstance(content, bytes):
                    (d / fname).write_bytes(content)
                else:
                    (d / fname).write_text(content)
        yield name, generate(d), make


def drafter_folders(rng, work):
    target = ROOT / "fixtures/zlab/targets/qwen3"
    seed = ROOT / "fixtures/zlab/qwen3_dflash_b16/drafter"
    config = json.loads((seed / "config.json").read_text())
    edits = []
    for key in ["block_size", "head_dim", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "hidden_size", "vocab_size", "rms_norm_eps", "num_target_layers",
                "max_position_embeddings"]:
        for v in [0, -1, 1 << 40, 10**9, 1e308, "x", None]:
            edits.append((f"{key}={v!r}", {key: v}))
    for ids in [[], [99], [-1], [0, 0, 0], list(range(64)), "x"]:
        edits.append((f"target_layer_ids={ids!r}", {"dflash_config": {**config["dflash_config"], "target_layer_ids": ids}}))
    for m in [-1, 10**9, None]:
        edits.append((f"mask_token_id={m!r}", {"dflash_config": {**config["dflash_config"], "mask_token_id": m}}))
    edits.append(("no dflash_config", {"dflash_config": None}))
    for i, (name, change) in enumerate(edits):
        d = work / f"drafter-{i}"

        def make(d=d, change=change):
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(seed, d)
            (d / "config.json").write_text(json.dumps({**config, **change}))
        yield name, ["generate", "--model", str(target), "--drafter", str(d), "--prompt", "Hello",
                     "--max-new-tokens", "4", "--device", "cpu"], make
    st = (seed / "model.safetensors").read_bytes()
    for i, (name, data) in enumerate([("weights truncated", st[: len(st) // 3]), ("weights empty", b""),
                                      ("weights mutated", mutate_bytes(rng, st, 512))]):
        d = work / f"drafter-w{i}"

        def make(d=d, data=data):
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(seed, d)
            (d / "model.safetensors").write_bytes(data)
        yield name, ["generate", "--model", str(target), "--drafter", str(d), "--prompt", "Hello",
                     "--max-new-tokens", "4", "--device", "cpu"], make


def cli_arguments(seeds):
    model = sorted((seeds / "gguf-load").glob("*/model.gguf"))[0]
    values = ["nan", "NaN", "inf", "-inf", "-1", "0", "1e309", "18446744073709551616", "abc", ""]
    for opt in ["--max-new-tokens", "--temperature", "--top-k", "--top-p", "--min-p",
                "--repetition-penalty", "--seed", "--context", "--block"]:
        for v in values:
            yield f"generate {opt} {v!r}", generate(model, opt, v), None
    for opt in ["--prompt-tokens", "--context"]:
        for v in values:
            yield f"bench {opt} {v!r}", ["bench", "--model", str(model), "--device", "cpu", opt, v], None
    yield "no such model", generate("/nonexistent/model.gguf"), None
    yield "a folder with nothing", generate(seeds), None
    yield "a FIFO as the model", ["generate", "--model", "/tmp/dflash-battery-fifo", "--prompt", "x",
                                  "--device", "cpu"], lambda: (Path("/tmp/dflash-battery-fifo").unlink(missing_ok=True),
                                                               os.mkfifo("/tmp/dflash-battery-fifo"))


def prompt_files(work):
    # The z-lab fixture's tiny target and its drafter: a pair that runs.
    model = ROOT / "fixtures/zlab/targets/qwen3"
    contents = {
        "empty": b"", "not json": b"hello\n", "chat is a number": b'{"chat": 5}\n',
        "prompt null": b'{"prompt": null}\n', "no field": b"{}\n", "an array": b"[]\n",
        "invalid utf-8": b'{"chat": "\xff\xfe"}\n', "bom": b'\xef\xbb\xbf{"prompt": "hi"}\n',
        "10 MB line": b'{"prompt": "' + b"a" * (10 << 20) + b'"}\n', "nul bytes": b"\x00" * 100,
        "both fields": b'{"chat": "a", "prompt": "b"}\n', "deep nesting": b"[" * 100000 + b"]" * 100000 + b"\n",
        "truncated line": b'{"chat": "hi', "100k empty lines": b"\n" * 100000,
        "valid": b'{"prompt": "hi"}\n{"prompt": "hello", "id": 3}\n',
    }
    for i, (name, data) in enumerate(contents.items()):
        f = work / f"prompts-{i}.jsonl"
        f.write_bytes(data)
        yield f"prompts: {name}", ["bench", "--model", str(model), "--device", "cpu", "--prompts", str(f),
                                   "--drafter", str(ROOT / "fixtures/zlab/qwen3_dflash_b16/drafter"),
                                   "--max-new-tokens", "2"], None


def truncated_while_loading(work):
    if not SMOLLM2.exists():
        return
    f = work / "shrinking.gguf"
    for delay in [0.0, 0.02, 0.05, 0.1, 0.2, 0.4]:
        for keep in [0, 1000, SMOLLM2.stat().st_size // 2]:
            def during(p, delay=delay, keep=keep):
                time.sleep(delay)
                os.truncate(f, keep)
            yield f"shrunk to {keep} after {delay} s", generate(f), (lambda: shutil.copy(SMOLLM2, f)), during


HUGE = ["0", "-1", "nan", "1e309", "4294967296", "1099511627776", "18446744073709551615", "18446744073709551616"]


def file_writing_commands(work, seeds):
    """Sizes past any machine for the commands that write files: a typed error each."""
    model = sorted((seeds / "gguf-load").glob("*/model.gguf"))[0]
    out = str(work / "written")
    for opt in ["--layers", "--block", "--mask-token-id", "--seed"]:
        for v in HUGE:
            yield f"make-random-drafter {opt} {v}", ["make-random-drafter", "--model", str(model), "--out", out, opt, v], None
    stdlib = work / "empty-stdlib"
    stdlib.mkdir(exist_ok=True)
    data = work / "data.jsonl"
    base_data = ["dflash-train", "data", "--model", str(model), "--out", str(data), "--prompts", "4",
                 "--max-new-tokens", "8", "--batch", "2", "--stdlib", str(stdlib)]
    # The data the train cases read (made once, by the first case).
    yield "data (valid)", base_data, lambda: data.unlink(missing_ok=True)
    for opt in ["--prompts", "--max-new-tokens", "--max-prompt-tokens", "--batch"]:
        for v in HUGE:
            yield f"data {opt} {v}", [*base_data[:5], str(work / "data-x.jsonl"), *base_data[6:], opt, v], \
                (lambda: (work / "data-x.jsonl").unlink(missing_ok=True))
    base_train = ["dflash-train", "train", "--model", str(model), "--data", str(data), "--out", str(work / "run-x"),
                  "--layers", "1", "--block", "4", "--steps", "2", "--seqs-per-step", "2", "--anchors", "4"]
    clear_run = lambda: shutil.rmtree(work / "run-x", ignore_errors=True)  # noqa: E731
    for opt in ["--layers", "--block", "--seqs-per-step", "--anchors", "--max-seq-len", "--checkpoint-every",
                "--holdout", "--mask-token", "--sampled-head", "--lr", "--warmup", "--weight-decay", "--gamma"]:
        for v in HUGE:
            yield f"train {opt} {v}", [*base_train, opt, v], clear_run
    for opt in ["--conv-kernel-size", "--conv-group-size", "--selector-rank", "--selector-top-k"]:
        for v in HUGE:
            yield f"train dflash2 {opt} {v}", [*base_train, "--arch", "dflash2", opt, v], clear_run
    for v in HUGE:
        yield f"train --steps {v}", [*base_train[:-6], "--steps", v], clear_run
        yield f"draft-vocab --size {v}", ["dflash-train", "draft-vocab", "--model", str(model), "--data", str(data),
                                          "--size", v, "--out", str(work / "vocab.json")], None
    yield "export of no run", ["dflash-train", "export", "--run", str(work / "nothing"), "--out", out], None
    yield "serving-files of no drafter", ["dflash-train", "serving-files", "--drafter", str(work / "nothing"),
                                          "--model", str(model)], None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="where the report goes (results/hostile-battery.json for the whole run)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="every category, one case in 6 (CI)")
    ap.add_argument("--only", action="append", help="a category (repeat); default all")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    for exe in (DFLASH, FUZZ, TRAIN):
        if not exe.exists():
            sys.exit(f"missing {exe}: cargo build --release -p dflash-cli -p dflash-train -p dflash-fuzz")
    work = Path(tempfile.mkdtemp(prefix="dflash-battery-"))
    seeds = work / "seeds"
    subprocess.run([str(FUZZ), "--dump-seeds", str(seeds), "--target", "gguf-load", "--target", "hf-folder"], check=True)
    categories = {
        "malformed GGUF": malformed_gguf(rng, work, seeds),
        "mutated SmolLM2": mutated_smollm2(rng, work),
        "Hugging Face folders": hf_folders(rng, work, seeds),
        "drafter folders": drafter_folders(rng, work),
        "CLI arguments": cli_arguments(seeds),
        "prompt files": prompt_files(work),
        "truncated while loading": truncated_while_loading(work),
        "file-writing commands": file_writing_commands(work, seeds),
    }
    if a.only:
        categories = {k: v for k, v in categories.items() if k in a.only}
    report = {"commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                       text=True).stdout.strip(), "quick": a.quick, "categories": {}, "unclean": []}
    for cat, cases in categories.items():
        counts = {"inputs": 0, "error": 0, "ran": 0, "unclean": 0}
        for i, case in enumerate(cases):
            name, args, prepare = case[:3]
            # The quick form keeps the first case of a category (the file-writing ones'
            # data) and one in 6 after it.
            if a.quick and i % 6 != 0:
                continue
            during = case[3] if len(case) > 3 else None
            if prepare:
                prepare()
            outcome, detail = run(args, during)
            counts["inputs"] += 1
            counts[outcome] += 1
            if outcome == "unclean":
                report["unclean"].append({"category": cat, "case": name, "detail": detail})
                print(f"UNCLEAN {cat}: {name}: {detail}", file=sys.stderr)
        report["categories"][cat] = counts
        print(json.dumps({cat: counts}), flush=True)
    totals = {k: sum(c[k] for c in report["categories"].values()) for k in ["inputs", "error", "ran", "unclean"]}
    report["totals"] = totals
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(totals))
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if totals["unclean"] else 0)


if __name__ == "__main__":
    main()
