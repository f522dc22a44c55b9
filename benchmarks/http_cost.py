"""Interpreter time per search request of ``mvdb serve``'s HTTP layer and of HTTP clients, with a
database that answers at once (the 2-core CPU: the figures behind the client's choice of
urllib3 and the serve extra's uvloop, README "Serving").

    python benchmarks/http_cost.py

1. For each (event loop, HTTP parser) of uvicorn: the server (``create_app`` over an instant
   database) in its own process, one client thread searching for 4 s; the server's and the
   client's CPU seconds per request (from /proc and process_time).
2. Clients against one server: httpx, urllib3 and http.client sending the same MessagePack body.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time

import numpy as np

SERVER = r'''
import sys, uvicorn, numpy as np
from mvdb.serve.app import create_app, uvicorn_config
from mvdb.engine.search import Hit
class Instant:
    store = None
    def __len__(self): return 1000
    def search(self, queries, sparse=None, k=10, **kw):
        one = [Hit(i, 1.0 - i * 0.01) for i in range(k)]
        return one if isinstance(queries, np.ndarray) and queries.ndim == 2 else [one for _ in range(len(queries))]
    def stats(self): return {"dim": 128}
cfg = uvicorn_config(create_app(Instant()), 5.0, "warning")
cfg.loop, cfg.http, cfg.port = sys.argv[1], sys.argv[2], int(sys.argv[3])
uvicorn.Server(cfg).run()
'''


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        s = f.read().rsplit(")", 1)[1].split()
    return (int(s[11]) + int(s[12])) / os.sysconf("SC_CLK_TCK")


def start(loop: str, parser: str, port: int) -> subprocess.Popen:
    import mvdb

    p = subprocess.Popen([sys.executable, "-c", SERVER, loop, parser, str(port)])
    for _ in range(300):
        try:
            mvdb.connect(f"http://127.0.0.1:{port}").close()
            return p
        except mvdb.MvdbError:
            time.sleep(0.05)
    raise RuntimeError("the server did not start")


def main():
    import mvdb
    from mvdb.serve import codec

    q = np.random.default_rng(0).standard_normal((32, 128)).astype(np.float16)
    out = {"servers": [], "clients": []}
    for i, (loop, parser) in enumerate([("asyncio", "h11"), ("asyncio", "httptools"), ("uvloop", "httptools")]):
        port = 8300 + i
        p = start(loop, parser, port)
        c = mvdb.connect(f"http://127.0.0.1:{port}")
        for _ in range(200):
            c.search(q, k=10)
        s0, c0, t0, n = cpu_s(p.pid), time.process_time(), time.perf_counter(), 0
        while time.perf_counter() < t0 + 4:
            c.search(q, k=10)
            n += 1
        row = {"loop": loop, "http": parser, "requests_per_s": n / (time.perf_counter() - t0),
               "server_us_per_request": (cpu_s(p.pid) - s0) / n * 1e6,
               "client_us_per_request": (time.process_time() - c0) / n * 1e6}
        out["servers"].append(row)
        print(json.dumps(row), flush=True)
        c.close()
        p.terminate()
        p.wait()
    import httpx
    import urllib3

    port = 8310
    p = start("asyncio", "httptools", port)
    headers = {"accept": codec.MSGPACK, "content-type": codec.MSGPACK}
    hx = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers)
    pool = urllib3.HTTPConnectionPool("127.0.0.1", port, maxsize=4, headers=headers)
    conn = http.client.HTTPConnection("127.0.0.1", port)

    def plain():
        conn.request("POST", "/search", body=codec.pack({"queries": q, "k": 10}), headers=headers)
        return codec.unpack(conn.getresponse().read())

    for name, fn in [("httpx", lambda: codec.unpack(hx.post("/search", content=codec.pack({"queries": q, "k": 10})).content)),
                     ("urllib3", lambda: codec.unpack(pool.request("POST", "/search", body=codec.pack({"queries": q, "k": 10})).data)),
                     ("http.client", plain)]:
        for _ in range(200):
            fn()
        t0, c0, n = time.perf_counter(), time.process_time(), 3000
        for _ in range(n):
            fn()
        row = {"client": name, "latency_us": (time.perf_counter() - t0) / n * 1e6,
               "client_us_per_request": (time.process_time() - c0) / n * 1e6}
        out["clients"].append(row)
        print(json.dumps(row), flush=True)
    p.terminate()
    p.wait()


if __name__ == "__main__":
    main()
