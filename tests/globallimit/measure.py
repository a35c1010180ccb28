"""What a global check adds to a request's latency, measured with the real parts (not a test:
`python3 tests/globallimit/measure.py [N]`). One node, hyper's path on both sides (the
listener's fast path off, as a route with a global limit is hyper's path's), a direct
response: requests on one keep-alive connection, one at a time, to two routes without a
global limit (an A/A pair: what the noise is) and two with one (a limit the load never
reaches), interleaved round by round. Prints p50/p99 per route and the ratios to the first."""

from __future__ import annotations

import http.client
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from parts import DOMAIN, Node, RateLimitService, Redis, ratelimit_binary, sluice_binary  # noqa: E402


def config(grpc: int) -> str:
    routes = ""
    for name, limited in (("plain-a", False), ("plain-b", False), ("global-a", True), ("global-b", True)):
        routes += (f'[[route]]\nname = "{name}"\npath_prefix = "/{name}/"\n'
                   'direct_response = { status = 200, body = "ok\\n" }\n')
        if limited:
            routes += ('global_rate_limit = { service = "rls", descriptors = '
                       '[[{ key = "bench", value = "x" }]] }\n')
    return (
        '[[listener]]\nname = "public"\nlisten = "127.0.0.1:0"\nfast_path = false\n'
        '[admin]\nlisten = "127.0.0.1:0"\n'
        f'[rate_limit_service.rls]\naddress = "127.0.0.1:{grpc}"\ndomain = "{DOMAIN}"\n'
        'timeout = "1s"\nfailure_mode = "closed"\n' + routes
    )


def main(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        redis = Redis()
        # `bench`: a limit the service counts in Redis (a descriptor without one is answered
        # without a Redis round trip), far above what this sends.
        service = RateLimitService(ratelimit_binary(), tmp, redis)
        node = Node(sluice_binary(), tmp, "node", config(service.grpc))
        try:
            conn = http.client.HTTPConnection("127.0.0.1", node.port)
            routes = ["plain-a", "global-a", "plain-b", "global-b"]
            took = {r: [] for r in routes}
            statuses = {}
            for i in range(rounds + 200):
                for r in routes:
                    t = time.perf_counter()
                    conn.request("GET", f"/{r}/")
                    res = conn.getresponse()
                    res.read()
                    if i >= 200:  # warm-up: connections, channels, caches
                        took[r].append(time.perf_counter() - t)
                        statuses[res.status] = statuses.get(res.status, 0) + 1
            base = None
            print(f"{rounds} requests per route, one at a time; statuses {statuses}")
            for r in routes:
                q = statistics.quantiles(took[r], n=100)
                p50, p99 = q[49] * 1e6, q[98] * 1e6
                base = base or (p50, p99)
                print(f"{r:9} p50 {p50:7.0f} us  p99 {p99:7.0f} us  "
                      f"ratio p50 {p50 / base[0]:.2f}  p99 {p99 / base[1]:.2f}")
        finally:
            for p in (node.proc, service.proc, redis.proc):
                p.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
