#!/usr/bin/env python3
"""`dflash serve` under load and faults, with the standard library only.

Phases, each on the same running server:
  one       one streamed client alone: its time to first token, tokens/s, and the RSS
            after it (the reference for memory);
  eight     8 streamed clients at once: p50/p99 time to first token and tokens/s;
  faults    tens of clients at once: streamed and whole answers, 3 requests on one
            kept-alive connection, clients hanging up mid-stream, heads trickled past
            the client timeout, malformed heads, bad JSON, oversized bodies, and a
            burst past the queue bound;
  after     the server answers, no request is left in flight, the hung-up ones were
            interrupted.
Every well-formed request must get its whole, correct answer (the text a lone client
got) or a clean 429/503 with Retry-After; every bad one a 4xx; no client may hang.

    python3 tests/serve/load.py                     # the CI form: one round of faults
    python3 tests/serve/load.py --rounds 60 --out results/serve-soak-COMMIT.json

The soak form repeats the faults phase and samples the server's RSS after each round:
memory must stay flat (the last rounds' RSS within 10% of the first's).
"""

import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = "Write a haiku about rain."
TIMEOUT = 120  # a client waiting longer than this counts as a hang


def model_path():
    out = subprocess.run([os.path.join(ROOT, "scripts/fetch-models.sh"), "smollm2"],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def start_server(args):
    cmd = [os.path.join(ROOT, "target/release/dflash"), "serve", "--model", model_path(),
           "--device", "cpu", "--port", "0", "--queue", str(args.queue),
           "--client-timeout", str(args.client_timeout), "--max-body", "100000"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    m = re.search(r":(\d+)\s*$", line)
    if not m:
        proc.kill()
        sys.exit(f"no address from the server: {line!r}")
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    return proc, int(m.group(1))


def rss_kib(pid, field="VmRSS"):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def body(tokens, stream):
    return json.dumps({"messages": [{"role": "user", "content": PROMPT}], "max_tokens": tokens,
                       "temperature": 0, "stream": stream})


def streamed(port, tokens):
    """(status, text, ttft_s, tok_s, retry_after) of one streamed request."""
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    c.request("POST", "/v1/chat/completions", body(tokens, True), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        r.read()
        return r.status, None, None, None, r.getheader("Retry-After")
    text, first, done, pieces = "", None, False, 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            break
        delta = json.loads(data)["choices"][0]["delta"].get("content")
        if delta:
            pieces += 1
            first = first or time.monotonic()
            text += delta
    end = time.monotonic()
    c.close()
    if not done:
        return 0, text, None, None, None
    rate = (pieces - 1) / (end - first) if first and end > first and pieces > 1 else None
    return 200, text, (first or end) - t0, rate, None


def whole(port, tokens, conn=None):
    c = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    c.request("POST", "/v1/chat/completions", body(tokens, False), {"Content-Type": "application/json"})
    r = c.getresponse()
    v = json.loads(r.read() or b"null")
    if conn is None:
        c.close()
    if r.status != 200:
        return r.status, None, r.getheader("Retry-After")
    return 200, v["choices"][0]["message"]["content"], None


def raw(port, data, trickle=b"", every=0.0):
    """Sends raw bytes (then `trickle` a byte every `every` s); the status of the answer,
    0 for none (the connection closed) and the seconds it took."""
    t0 = time.monotonic()
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    out = b""
    try:
        s.sendall(data)
        for b in trickle:
            time.sleep(every)
            s.sendall(bytes([b]))
    except OSError:
        pass  # the server closed the connection: its answer may be waiting
    try:
        while b"\r\n" not in out:
            chunk = s.recv(4096)
            if not chunk:
                break
            out += chunk
    except OSError:
        pass
    finally:
        s.close()
    m = re.match(rb"HTTP/1\.1 (\d+)", out)
    return (int(m.group(1)) if m else 0), time.monotonic() - t0


def health(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/health")
    r = c.getresponse()
    v = json.loads(r.read())
    c.close()
    return r.status, v


def pct(xs, p):
    xs = sorted(x for x in xs if x is not None)
    return round(xs[min(len(xs) - 1, round((len(xs) - 1) * p))], 4) if xs else None


def run_all(fns):
    """Runs the callables at once; their results, or a failure where one hangs."""
    results = [None] * len(fns)

    def go(i, f):
        try:
            results[i] = f()
        except Exception as e:  # a failure of the client, counted against the server
            results[i] = ("error", repr(e))

    threads = [threading.Thread(target=go, args=(i, f), daemon=True) for i, f in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT + 30)
    hung = sum(t.is_alive() for t in threads)
    return results, hung


def hang_up(port, tokens):
    """Starts a streamed request, reads its first event and leaves."""
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    b = body(tokens, True).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(b) + b)
    got = b""
    while b"data: " not in got:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    s.close()
    return "hung-up" if got.startswith(b"HTTP/1.1 200") else got[:12].decode(errors="replace")


def keep_alive(port, tokens, want):
    """3 requests on one connection: the same socket each time, each answer correct."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    texts, socks = [], []
    for _ in range(3):
        status, text, _ = whole(port, tokens, conn=c)
        if status != 200:
            c.close()
            return ("busy", status)
        texts.append(text)
        socks.append(id(c.sock))
    c.close()
    return ("keep-alive", all(t == want for t in texts) and len(set(socks)) == 1)


def faults(port, args, want):
    """One round of the fault mix; (counts, failures)."""
    n = args.tokens
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * 200_000 + b'"}]}'
    cases = []
    cases += [("stream", lambda: streamed(port, n))] * 6
    cases += [("whole", lambda: whole(port, n))] * 6
    cases += [("keep-alive", lambda: keep_alive(port, n, want))] * 2
    cases += [("hang-up", lambda: hang_up(port, 400))] * 4
    slow = (b"GET /health HTTP/1.1\r\n", b"X-Slow: " + b"a" * 40 + b"\r\n", 0.25)
    cases += [("slow-head", lambda: raw(port, slow[0], slow[1], slow[2]))] * 3
    cases += [("malformed", lambda: raw(port, b"BLAH\x00\x01 / HTTP/9\r\n\r\n"))] * 3
    bad = b'{"messages": [}'
    bad_req = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(bad) + bad
    cases += [("bad-json", lambda: raw(port, bad_req))] * 3
    over = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(big) + big
    cases += [("oversized", lambda: raw(port, over))] * 3
    results, hung = run_all([f for _, f in cases])
    counts, failures = {}, []
    for (kind, _), r in zip(cases, results):
        verdict = judge(kind, r, want, args.client_timeout)
        counts[f"{kind}:{verdict[0]}"] = counts.get(f"{kind}:{verdict[0]}", 0) + 1
        if not verdict[1]:
            failures.append((kind, r))
    return counts, failures, hung


def judge(kind, r, want, client_timeout):
    """(what happened, whether that is allowed)."""
    if r is None or (isinstance(r, tuple) and r[0] == "error"):
        return "client-error", False
    if kind in ("stream", "whole"):
        status, text = r[0], r[1]
        if status == 200:
            return "answered", text == want
        retry = r[-1]
        return f"refused-{status}", status in (429, 503) and retry is not None
    if kind == "keep-alive":
        return (r[0], r[1] is True) if r[0] == "keep-alive" else (f"refused-{r[1]}", r[1] in (429, 503))
    if kind == "hang-up":
        return r, r in ("hung-up", "HTTP/1.1 429", "HTTP/1.1 503")
    status, took = r
    allowed = {"slow-head": (408, 0), "malformed": (400,), "bad-json": (400,), "oversized": (413,)}[kind]
    bounded = took < client_timeout + 10
    return f"{status}", status in allowed and bounded


def burst(port, args, want):
    """Twice the queue's bound at once: each answered whole and correct, or 429."""
    fns = [lambda: whole(port, args.tokens) for _ in range(2 * (args.queue + 1) + 4)]
    results, hung = run_all(fns)
    ok = sum(1 for r in results if r and r[0] == 200 and r[1] == want)
    refused = sum(1 for r in results if r and r[0] == 429 and r[2] is not None)
    return {"clients": len(fns), "answered": ok, "refused_429": refused,
            "other": len(fns) - ok - refused, "hung": hung}


def wait_idle(port, timeout=30):
    """Seconds until nothing is in flight, or None."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        status, h = health(port)
        if status == 200 and h["requests"]["in_flight"] == 0:
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def hang_up_latency(port):
    """Seconds from a client leaving mid-stream to its place being free (its generation
    stopped: the engine answers the next request)."""
    before = health(port)[1]["requests"]["interrupted"]
    hang_up(port, 2000)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 20:
        h = health(port)[1]["requests"]
        if h["interrupted"] > before and h["in_flight"] == 0:
            return round(time.monotonic() - t0, 3)
        time.sleep(0.02)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--queue", type=int, default=24)
    ap.add_argument("--client-timeout", type=float, default=3.0)
    ap.add_argument("--out")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    proc, port = start_server(args)
    report, failed = {"commit": commit}, []
    try:
        status, want, ttft, rate, _ = streamed(port, args.tokens)
        assert status == 200 and want, "the lone client got no answer"
        one_rss = rss_kib(proc.pid)
        report["one"] = {"ttft_s": round(ttft, 4), "tok_s": round(rate or 0, 2), "rss_mib": round(one_rss / 1024, 1)}
        results, hung = run_all([lambda: streamed(port, args.tokens) for _ in range(8)])
        ok = [r for r in results if r and r[0] == 200]
        if hung or len(ok) != 8 or any(r[1] != want for r in ok):
            failed.append(("eight", results, hung))
        report["eight"] = {"answered": len(ok), "ttft_p50_s": pct([r[2] for r in ok], 0.5),
                           "ttft_p99_s": pct([r[2] for r in ok], 0.99),
                           "tok_s_p50": pct([r[3] for r in ok], 0.5)}
        report["hang_up_to_free_s"] = hang_up_latency(port)
        if report["hang_up_to_free_s"] is None or report["hang_up_to_free_s"] > 1.0:
            failed.append(("hang-up latency", report["hang_up_to_free_s"]))
        rounds = []
        for i in range(args.rounds):
            counts, failures, hung = faults(port, args, want)
            b = burst(port, args, want)
            idle = wait_idle(port)
            rounds.append({"round": i, "faults": counts, "burst": b, "hung": hung,
                           "idle_after_s": idle, "rss_mib": round(rss_kib(proc.pid) / 1024, 1)})
            if failures or hung or b["other"] or b["hung"] or idle is None:
                failed.append(("round", i, failures, hung, b, idle))
            print(json.dumps(rounds[-1]), flush=True)
        status, h = health(port)
        report["after"] = {"health": status, "requests": h["requests"]}
        if status != 200:
            failed.append(("after", status))
        peak = rss_kib(proc.pid, "VmHWM")
        report["peak_rss_mib"] = round(peak / 1024, 1)
        report["peak_over_one"] = round(peak / one_rss, 3)
        if peak > 1.5 * one_rss:
            failed.append(("peak rss", peak, one_rss))
        rss = [r["rss_mib"] for r in rounds]
        report["rounds"] = len(rounds)
        report["requests"] = h["requests"]["served"] + h["requests"]["interrupted"] + h["requests"]["rejected"]
        report["rss_mib_by_round"] = rss if len(rss) <= 20 else rss[:: max(1, len(rss) // 20)]
        if len(rss) >= 10:
            first, last = statistics.mean(rss[1:4]), statistics.mean(rss[-3:])
            report["rss_growth"] = round(last / first, 3)
            if last > 1.10 * first:
                failed.append(("rss growth", first, last))
    finally:
        proc.terminate()
        code = proc.wait(timeout=60)
    report["exit_on_sigterm"] = code
    report["failed"] = [repr(f)[:2000] for f in failed]
    print(json.dumps(report, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    if failed or code != 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
