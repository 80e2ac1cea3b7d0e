"""Page times of the console (scripts/bench --console): each page requested
N times over one keep-alive connection, each time for another award or key
of the seeded ledger; p50 and p99 of the whole request (server time + local
HTTP), in milliseconds.

python3 bench/console.py HOST:PORT TOKEN_FILE CLAIMS AWARDS [REQUESTS]
"""

import hashlib
import http.client
import json
import random
import sys
import time


def main():
    addr, token_file, claims, awards = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    n = int(sys.argv[5]) if len(sys.argv) > 5 else 500
    token = open(token_file).read().strip()
    host, port = addr.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port))
    headers = {"Authorization": f"Bearer {token}"}
    rng = random.Random(7)

    def key(g):
        return hashlib.sha256(f"k{g}".encode()).hexdigest()

    def award(a):
        return f"AWD-B-{a:06d}"

    per_award = claims // awards
    pages = {
        "find (award id)": lambda: f"/find?q={award(rng.randrange(awards))}",
        "find (key prefix)": lambda: f"/find?q={key(rng.randrange(claims))[:12]}",
        "find (disbursement id)": lambda: "/find?q=" + hashlib.md5(f"d{rng.randrange(claims)}".encode()).hexdigest(),
        "delivery": lambda: f"/delivery?key={key(rng.randrange(claims))}",
        "award (first page)": lambda: f"/award?id={award(rng.randrange(awards))}",
        "award (a later page)": lambda: f"/award?id={award(rng.randrange(awards))}&after={rng.randrange(per_award)}",
        "relay": lambda: "/relay",
        "trail": lambda: "/trail",
    }
    results = {}
    for name, path in pages.items():
        times = []
        for i in range(n + 20):
            p = path()
            start = time.perf_counter()
            conn.request("GET", p, headers=headers)
            r = conn.getresponse()
            r.read()
            took = (time.perf_counter() - start) * 1000
            if r.status not in (200, 303):
                raise SystemExit(f"{p}: HTTP {r.status}")
            if i >= 20:  # the first requests warm the pool and caches
                times.append(took)
        times.sort()
        results[name] = {"p50_ms": round(times[len(times) // 2], 2),
                         "p99_ms": round(times[int(len(times) * 0.99) - 1], 2),
                         "max_ms": round(times[-1], 2), "requests": len(times)}
        print(f"{name:24} p50 {results[name]['p50_ms']:7.2f} ms   p99 {results[name]['p99_ms']:7.2f} ms   "
              f"max {results[name]['max_ms']:7.2f} ms   ({n} requests)", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
