"""The per-job training metrics at 1,000 jobs: the operator's memory for them and the time of a scrape.

    .venv/bin/python -m bench.metrics_scale [--jobs 1000] [--scrapes 20]

In process, with the operator's own collector (`paralleljob.handlers.job_metrics`) behind prometheus_client's HTTP
server, as the operator serves /metrics: `--jobs` job objects shaped like a running job's (status with progress,
restarts, checkpoint, spares and the efficiency figures) are observed as the job watch hands them over. Prints the
memory the collector's table holds (tracemalloc, and the process's resident set before and after), the series
exposed, the exposition's size, and the wall time of one scrape over HTTP on loopback (best and median of
--scrapes). Figures are recorded in docs/install.md ("Metrics").
"""

from __future__ import annotations

import argparse
import gc
import socket
import statistics
import time
import tracemalloc
import urllib.request
from typing import Any

import prometheus_client
import psutil

from paralleljob.handlers.job_metrics import JobMetrics


def running_job(index: int) -> dict[str, Any]:
    """A running job's object as the watch sees it, with every figure the metrics read."""
    return {
        "metadata": {"namespace": f"team-{index % 20}", "name": f"llama-{index:05d}"},
        "spec": {"training": {"steps": 100000}, "failurePolicy": {"progressTimeoutSeconds": 600}},
        "status": {
            "phase": "Running",
            "layout": "8x8x16",
            "worldSize": 1024,
            "gpusPerNode": 8,
            "spareNodes": ["spare-a", "spare-b"],
            "restarts": 3,
            "inPlaceRestarts": 2,
            "lastCheckpointStep": 42000,
            "lastCheckpointTime": "2026-12-04T15:00:00Z",
            "progress": {
                "step": 42123,
                "totalSteps": 100000,
                "loss": 2.3456,
                "validationLoss": 2.4567,
                "tokensPerSecond": 12345678.9,
                "tflopsPerGpu": 402.1,
                "mfu": 0.4066,
                "stepSeconds": 4.12,
                "modeledStepSeconds": 3.87,
                "stepOverModeled": 1.065,
                "updated": "2026-12-04T15:59:50Z",
                "stragglers": '[{"node": "node-17", "factor": 1.42}]',
            },
        },
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--scrapes", type=int, default=20)
    args = parser.parse_args()
    registry = prometheus_client.CollectorRegistry()
    collector = JobMetrics()
    registry.register(collector)
    jobs = [running_job(i) for i in range(args.jobs)]
    gc.collect()
    rss_before = psutil.Process().memory_info().rss
    tracemalloc.start()
    for job in jobs:
        collector.observe(job)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del jobs
    gc.collect()
    rss_after = psutil.Process().memory_info().rss
    port = free_port()
    prometheus_client.start_http_server(port, addr="127.0.0.1", registry=registry)
    url = f"http://127.0.0.1:{port}/metrics"
    times, body = [], b""
    for _ in range(args.scrapes):
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=30) as response:
            body = response.read()
        times.append(time.perf_counter() - started)
    samples = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
    print(f"jobs                 {args.jobs}")
    print(f"series               {samples} ({samples / args.jobs:.0f} per job)")
    print(f"table memory         {held / 2**20:.2f} MiB (tracemalloc; {held / args.jobs / 1024:.2f} KiB per job)")
    print(f"resident set growth  {(rss_after - rss_before) / 2**20:.1f} MiB")
    print(f"exposition           {len(body) / 2**20:.2f} MiB")
    print(f"scrape over HTTP     best {min(times) * 1e3:.0f} ms, median {statistics.median(times) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
