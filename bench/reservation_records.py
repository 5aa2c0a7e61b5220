"""Reservations from the jobs' attempt records at 10,000 jobs: what reading them costs each admission, and what
keeping them in memory would cost instead (a label-selected informer of the `-config` ConfigMaps).

    .venv/bin/python -m bench.reservation_records [--jobs 10000] [--page-size 500] [--repeat 5]

Every admission reads the records that reserve nodes (`reads.list_reserving_config_maps`: the ConfigMaps
labelled paralleljob.io/reserving=true, cluster-wide, in pages) and turns them into reservations
(`records.reservations_of`), under the admission lock, so that what another operator wrote just before is in
it. The ConfigMap measured is the one the operator writes: a 16-node job (4x4x4 on 4-GPU nodes, the operator
tests' job) admitted by a real admission pass on the operator tests' upstream control plane
(testcluster/server.py), as the API server returns it, then copied `--jobs` times under other names,
namespaces, uids and nodes, all of them live (the worst case: every job of the cluster reserving).

Prints:
1. the size of one ConfigMap as the API returns it, and of the whole list;
2. the client's side of one read (decoding each page's JSON as the client does, then the reservations; the
   API server's own time is not in it): wall and CPU time, best and median of --repeat;
3. the memory that read needs at its peak (tracemalloc), page by page as the operator reads, and all at once;
4. the memory a watch would keep instead: only the reservations (the least a label-selected informer could
   keep), every record parsed (`AttemptRecord`), or every ConfigMap as decoded (what an informer keeping the
   objects, as kopf's would, holds).
Figures are recorded in docs/operator.md ("Reservations").
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from paralleljob.handlers import reconcile
from paralleljob.k8s import session as k8s_session
from paralleljob.manifests import labels, records
from testcluster import server as upstream
from testcluster.admin import Cluster, job_doc
from testcluster.operators import fresh_view

NODES_PER_JOB = 16


def admitted_config_map() -> dict[str, Any]:
    """The `-config` ConfigMap of a 16-node job, as a real admission pass writes it and the API returns it."""
    workdir = Path(tempfile.mkdtemp(prefix="reservation-records-"))
    try:
        with contextlib.contextmanager(upstream.started)(workdir) as server:
            cluster = Cluster(server)
            cluster.add_nodes(NODES_PER_JOB)
            cluster.apply(job_doc())
            session = k8s_session.connect(str(server.kubeconfig))
            settings = reconcile.Settings(image="trainer:bench")
            view = fresh_view(cluster)
            assert reconcile.reconcile(session, settings, "research", "gpt", view).step == "awaiting-admission"
            assert reconcile.reconcile(session, settings, "research", "gpt", view, admit=True).step == "admitted"
            found = cluster.core.read_namespaced_config_map("gpt-config", "research")
            return dict(cluster.client.sanitize_for_serialization(found))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def copies(template: dict[str, Any], jobs: int) -> list[dict[str, Any]]:
    """`jobs` ConfigMaps like `template`, each another job's in one of 100 namespaces, on its own 16 nodes."""
    record = records.record_of(template)
    assert record is not None
    found = []
    for index in range(jobs):
        job, namespace = f"job-{index:05d}", f"team-{index % 100:02d}"
        nodes = tuple(f"gpu-{(index * NODES_PER_JOB + rank) % 100_000:05d}" for rank in range(NODES_PER_JOB))
        config_map = copy.deepcopy(template)
        metadata = config_map["metadata"]
        metadata.update(name=labels.config_map_name(job), namespace=namespace, uid=f"uid-cm-{index}")
        metadata["labels"][labels.JOB_LABEL] = job
        metadata["ownerReferences"][0].update(name=job, uid=f"uid-{index}")
        metadata["resourceVersion"] = str(1000 + index)
        config_map["data"][records.RECORD_FILE] = dataclasses.replace(record, nodes=nodes).to_json()
        found.append(config_map)
    return found


def pages_as_sent(config_maps: list[dict[str, Any]], page_size: int) -> list[bytes]:
    """The list's pages as the API server sends them (JSON of a ConfigMapList)."""
    return [
        json.dumps({"kind": "ConfigMapList", "items": config_maps[start : start + page_size]}).encode()
        for start in range(0, len(config_maps), page_size)
    ]


def decoded(pages: list[bytes]) -> Iterator[dict[str, Any]]:
    """What the operator's paged read yields: each page decoded when it arrives, its items one by one."""
    for page in pages:
        yield from json.loads(page)["items"]


def one_read(pages: list[bytes]) -> int:
    return len(records.reservations_of(decoded(pages)))


def timed(pages: list[bytes], repeat: int) -> tuple[list[float], list[float], int]:
    wall, cpu, found = [], [], 0
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        found = one_read(pages)
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return wall, cpu, found


def peak_of(action: Any) -> float:
    """MiB allocated at the peak of `action()` beyond what was allocated before it (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    result = action()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del result
    return (peak - before) / 2**20


def kept_of(build: Any) -> float:
    """MiB still allocated after `build()`, while its result is kept (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = build()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return (after - before) / 2**20


def ms(samples: list[float]) -> str:
    return f"best {min(samples) * 1e3:.0f} ms, median {statistics.median(samples) * 1e3:.0f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--page-size", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    template = admitted_config_map()
    config_maps = copies(template, args.jobs)
    pages = pages_as_sent(config_maps, args.page_size)
    one, whole = len(json.dumps(template)), sum(len(page) for page in pages)
    print(f"1. one job's ConfigMap: {one / 1024:.1f} KiB of JSON; {args.jobs} of them: {whole / 2**20:.1f} MiB")
    wall, cpu, found = timed(pages, args.repeat)
    print(f"2. one read of {args.jobs} jobs' records ({found} reservations): wall {ms(wall)}; CPU {ms(cpu)}")
    paged = peak_of(lambda: one_read(pages))
    at_once = peak_of(lambda: len(records.reservations_of(list(decoded(pages)))))
    print(
        f"3. memory at the read's peak: {paged:.1f} MiB page by page, {at_once:.1f} MiB with every page decoded at once"
    )
    kept = {
        "as reservations (node, GPUs, holder)": kept_of(lambda: records.reservations_of(decoded(pages))),
        "as parsed records": kept_of(lambda: [records.record_of(config_map) for config_map in decoded(pages)]),
        "as decoded ConfigMaps": kept_of(lambda: list(decoded(pages))),
    }
    said = "; ".join(f"{mib:.1f} MiB {how} ({mib * 1024 / args.jobs:.2f} KiB a job)" for how, mib in kept.items())
    print(f"4. kept by a watch of them: {said}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
