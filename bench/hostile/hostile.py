#!/usr/bin/env python3
"""Hostile-client benchmark of hami-webhook: one client stalls at every stage while another sends
well-formed reviews; measures the good reviews' latency, how long the server takes to close each
stalled connection, and the server's peak RSS (VmHWM from /proc/PID/status).

Python standard library only (ssl, socket, threading). Starts `hami-webhook serve --dev` (a
throwaway CA and certificate for localhost) on free loopback ports with the settings below, so
nothing else is needed:

    cargo build --release -p hami-webhook
    python3 bench/hostile/hostile.py [--bin PATH/hami-webhook] [--per-kind 64]
        [--idle-timeout 10] [--large-bodies 16] [--seconds 30] [--json out.json]

Kinds opened by the hostile client, `--per-kind` of each (large bodies: `--large-bodies`):
  tcp-only        TCP connection, no ClientHello
  partial-hello   10 bytes of a ClientHello, then nothing
  tls-silent      TLS done (ALPN h2), nothing sent
  p, pr, pre23    TLS done, then `P`, `PR`, or 23 of the 24 HTTP/2 preface bytes
  h1-half         TLS, half the headers of a POST
  h2-idle         TLS, the full HTTP/2 preface and SETTINGS, no stream
  body-stalled    TLS, POST headers with Content-Length 65536 and 100 body bytes
  body-large      TLS, POST with Content-Length 8 MiB - 1 KiB: 7 MiB sent, then stalled (or, with
                  --complete-large, all of it: the review then answers 400, not a pod)
The good client posts the review in tests/fixtures/plain-pod.json on a fresh TLS connection
(HTTP/1.1) every 50 ms, and on one keep-alive connection, and checks every answer is
`allowed: true` with the request's uid.
"""

import argparse
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
REVIEW = open(os.path.join(ROOT, "webhook/tests/fixtures/plain-pod.json"), "rb").read()
UID = json.loads(REVIEW)["request"]["uid"]
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# An empty SETTINGS frame: length 0, type 4, flags 0, stream 0.
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def vm_hwm_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


class Server:
    """A running `hami-webhook serve --dev` (see `start`)."""

    port: int
    ops: int
    proc: subprocess.Popen
    ca: str

    def ops_get(self, path):
        with socket.create_connection(("127.0.0.1", self.ops), timeout=5) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            out = b""
            while chunk := s.recv(65536):
                out += chunk
            return out

    def tls(self, alpn="h2", timeout=30):
        """A TLS connection with the handshake done, offering `alpn`."""
        if alpn not in self.ctxs:
            c = ssl.create_default_context(cafile=self.ca)
            c.set_alpn_protocols([alpn])
            self.ctxs[alpn] = c
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        return self.ctxs[alpn].wrap_socket(raw, server_hostname="localhost")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        t0 = time.time()
        self.proc.wait(timeout=60)
        return time.time() - t0


def post(sock, body, close=False, declared=None):
    head = (f"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {declared if declared is not None else len(body)}\r\n")
    if close:
        head += "Connection: close\r\n"
    sock.sendall(head.encode() + b"\r\n" + body)


def read_response(sock):
    """One HTTP/1.1 response with Content-Length: (status, body)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("closed before the response")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    status = int(head.split()[1])
    n = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
    while len(rest) < n:
        chunk = sock.recv(65536)
        if not chunk:
            raise OSError("closed mid-response")
        rest += chunk
    return status, rest[:n]


def check(status, body):
    if status != 200:
        raise AssertionError(f"HTTP {status}: {body[:200]!r}")
    out = json.loads(body)
    if out["response"]["allowed"] is not True or out["response"]["uid"] != UID:
        raise AssertionError(f"unexpected answer {out}")


class Hostile:
    """The stalled connections and when the server closed each (seconds after opening)."""

    def __init__(self, server):
        self.server = server
        self.open = []  # (kind, socket, opened_at)
        self.closed = {}  # kind -> [seconds]
        self.lock = threading.Lock()

    def add(self, kind, sock):
        t = time.time()
        self.open.append((kind, sock, t))
        threading.Thread(target=self._watch, args=(kind, sock, t), daemon=True).start()

    def _watch(self, kind, sock, t):
        sock.settimeout(None)
        try:
            while sock.recv(65536):
                pass
        except (OSError, ssl.SSLError):
            pass
        with self.lock:
            self.closed.setdefault(kind, []).append(time.time() - t)

    def open_all(self, per_kind, large, complete_large):
        s = self.server
        for _ in range(per_kind):
            self.add("tcp-only", socket.create_connection(("127.0.0.1", s.port)))
            raw = socket.create_connection(("127.0.0.1", s.port))
            raw.sendall(bytes([0x16, 0x03, 0x01, 0x00, 0xC8, 0x01, 0x00, 0x00, 0xC4, 0x03]))
            self.add("partial-hello", raw)
            self.add("tls-silent", s.tls("h2"))
            for kind, n in (("p", 1), ("pr", 2), ("pre23", 23)):
                t = s.tls("h2")
                t.sendall(PREFACE[:n])
                self.add(kind, t)
            t = s.tls("http/1.1")
            t.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")
            self.add("h1-half", t)
            t = s.tls("h2")
            t.sendall(PREFACE + SETTINGS)
            self.add("h2-idle", t)
            t = s.tls("http/1.1")
            post(t, b'{"apiVersion":' + b" " * 86, declared=65536)
            self.add("body-stalled", t)
        size = 8 * 1024 * 1024 - 1024
        sent = size if complete_large else 7 * 1024 * 1024
        chunk = b" " * (1024 * 1024)
        for _ in range(large):
            t = s.tls("http/1.1")
            t.sendall((f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {size}\r\n\r\n").encode())
            left = sent
            while left:
                t.sendall(chunk[: min(left, len(chunk))])
                left -= min(left, len(chunk))
            self.add("body-large", t)


def good_client(server, seconds, latencies, errors, stop):
    keep = server.tls("http/1.1")
    end = time.time() + seconds
    while time.time() < end and not stop.is_set():
        for fresh in (True, False):
            try:
                t0 = time.perf_counter()
                if fresh:
                    s = server.tls("http/1.1")
                    post(s, REVIEW, close=True)
                    check(*read_response(s))
                    s.close()
                else:
                    try:
                        post(keep, REVIEW)
                        check(*read_response(keep))
                    except OSError:
                        # Closed by the idle timeout between rounds: a new keep-alive connection.
                        keep = server.tls("http/1.1")
                        post(keep, REVIEW)
                        check(*read_response(keep))
                latencies["fresh" if fresh else "keep-alive"].append(
                    (time.perf_counter() - t0) * 1000)
            except Exception as e:  # noqa: BLE001 - every failure is reported
                errors.append(repr(e))
        time.sleep(0.05)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--bin", default=None,
                    help="hami-webhook (default: release/ of cargo's target folder, scripts/target-dir)")
    ap.add_argument("--per-kind", type=int, default=64)
    ap.add_argument("--large-bodies", type=int, default=16)
    ap.add_argument("--complete-large", action="store_true")
    ap.add_argument("--idle-timeout", type=int, default=10)
    ap.add_argument("--request-timeout", type=int, default=10)
    ap.add_argument("--max-concurrent", type=int, default=8)
    ap.add_argument("--max-connections", type=int, default=256)
    ap.add_argument("--body-memory", type=int, default=None, help="server.bodyMemoryBytes")
    ap.add_argument("--worker-threads", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=None,
                    help="good-client duration; default idle timeout + request timeout + 5")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.bin is None:
        target = subprocess.run([os.path.join(ROOT, "scripts", "target-dir")], check=True,
                                stdout=subprocess.PIPE, text=True).stdout.strip()
        args.bin = os.path.join(target, "release", "hami-webhook")
    seconds = args.seconds or (max(args.idle_timeout, args.request_timeout) + 5)
    settings = {
        "IDLETIMEOUTSECONDS": args.idle_timeout,
        "TLSHANDSHAKETIMEOUTSECONDS": args.idle_timeout,
        "REQUESTTIMEOUTSECONDS": args.request_timeout,
        "MAXCONCURRENTREQUESTS": args.max_concurrent,
        "MAXCONNECTIONS": args.max_connections,
        "WORKERTHREADS": args.worker_threads,
        "SHUTDOWNGRACESECONDS": 25,
    }
    if args.body_memory is not None:
        settings["BODYMEMORYBYTES"] = args.body_memory
    server = start(args.bin, settings)
    hwm_before = vm_hwm_kib(server.proc.pid)
    hostile = Hostile(server)
    latencies = {"fresh": [], "keep-alive": []}
    errors = []
    stop = threading.Event()
    good = threading.Thread(target=good_client, args=(server, seconds, latencies, errors, stop))
    good.start()
    opened_at = time.time()
    hostile.open_all(args.per_kind, args.large_bodies, args.complete_large)
    opening_s = time.time() - opened_at
    good.join()
    # Everything the hostile client opened must be closed by the server by now.
    deadline = time.time() + max(args.idle_timeout, args.request_timeout) + 5
    total = len(hostile.open)
    while time.time() < deadline:
        with hostile.lock:
            done = sum(len(v) for v in hostile.closed.values())
        if done == total:
            break
        time.sleep(0.1)
    hwm = vm_hwm_kib(server.proc.pid)
    still_open = total - sum(len(v) for v in hostile.closed.values())
    # SIGTERM with a few idle keep-alive connections open.
    idle = [server.tls("http/1.1") for _ in range(8)]
    for s in idle:
        post(s, REVIEW)
        check(*read_response(s))
    exit_s = server.stop()
    result = {
        "settings": settings,
        "hostile_connections": total,
        "hostile_opening_seconds": round(opening_s, 2),
        "good_reviews": {k: len(v) for k, v in latencies.items()},
        "good_review_errors": errors[:10],
        "good_review_error_count": len(errors),
        "latency_ms": {
            k: {"p50": round(pct(v, 50), 2), "p99": round(pct(v, 99), 2),
                "max": round(max(v), 2) if v else None}
            for k, v in latencies.items()
        },
        "closed_after_s_max_by_kind": {
            k: round(max(v), 2) for k, v in sorted(hostile.closed.items())
        },
        "still_open": still_open,
        "peak_rss_mib": round(hwm / 1024, 1),
        "rss_at_start_mib": round(hwm_before / 1024, 1),
        "sigterm_exit_seconds": round(exit_s, 2),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 1 if errors or still_open else 0


def start(binary, settings):
    """Start the server, learning the CA path from its output before connecting."""
    port, ops = free_port(), free_port()
    env = dict(os.environ, RUST_LOG="warn")
    for k, v in settings.items():
        env[f"HAMI_SERVER__{k}"] = str(v)
    proc = subprocess.Popen(
        [binary, "serve", "--dev", f"--listen=127.0.0.1:{port}", f"--metrics-listen=127.0.0.1:{ops}"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    ca = None
    for line in proc.stdout:
        m = re.search(r"throwaway CA written to (\S+)", line)
        if m:
            ca = m.group(1)
            break
    if ca is None:
        raise SystemExit("the server did not start")
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    server = Server()
    server.port, server.ops, server.proc, server.ca = port, ops, proc, ca
    server.ctxs = {}
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            if b"200 OK" in server.ops_get("/readyz"):
                return server
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit("the server never became ready")


if __name__ == "__main__":
    sys.exit(main())
