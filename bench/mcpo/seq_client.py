"""Sequential latency client for bench/mcpo/run.sh.

Sends N POSTs one at a time over a single keep-alive http.client connection
(after a short warm-up) and prints {"n":..,"p50_ms":..,"p90_ms":..,"p99_ms":..}.
Usage: seq_client.py HOST PORT PATH N
"""
import http.client
import json
import math
import sys
import time


def pct(sorted_ms, p):
    # nearest-rank percentile
    k = max(1, math.ceil(p / 100.0 * len(sorted_ms)))
    return sorted_ms[k - 1]


def main():
    host, port, path, n = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    body = json.dumps({"message": "hello"}).encode()
    headers = {"Content-Type": "application/json"}
    conn = http.client.HTTPConnection(host, port, timeout=30)

    def call():
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise SystemExit(f"seq_client: HTTP {resp.status}: {data[:200]!r}")
        return data

    for _ in range(min(100, max(10, n // 10))):  # warm-up, not recorded
        call()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - t0) / 1e6)
    conn.close()
    samples.sort()
    print(json.dumps({
        "n": n,
        "p50_ms": round(pct(samples, 50), 3),
        "p90_ms": round(pct(samples, 90), 3),
        "p99_ms": round(pct(samples, 99), 3),
    }))


if __name__ == "__main__":
    main()
