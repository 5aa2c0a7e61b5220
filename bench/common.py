"""What the benchmarks share, in one module: trainer runs, one 70B-shaped llama layer built in a fresh interpreter,
the planner's GPT-175B job, the scale benches' fake nodes and admission cluster, and reading a product run's steps. Not a benchmark itself (bench/README.md).

Job files, ports and torchrun gangs come from the trainer's harness (`testcluster.trainer_harness`), so
benchmarks and tests run the trainer the same way; the cluster, the operator process and the chart's parts from
`testcluster` too. No benchmark imports `tests.*` (tests/setup/test_imports.py). kwok, which plays the fake nodes' kubelets, is `bench.kwok`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench import kwok
from paralleljob.api import ResolvedJob, validate_document
from paralleljob.manifests import labels, records
from paralleljob.planning import synth
from paralleljob_contract import metrics
from paralleljob_contract.layout import Layout
from testcluster import polling
from testcluster import trainer_harness as harness
from testcluster.admin import job_doc
from testcluster.api import Api
from testcluster.product import Product

REPO = Path(__file__).resolve().parents[1]

ADAMW = {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.1}}

# One layer of Llama 2/3 70B, built for TP rank 0 of 8 (bench.trainer_init, bench.trainer_pretrained).
LLAMA_70B_LAYER = {"hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672}
LAYER_TENSOR = 8
# What runs before a `llama_layer_child` body: one thread, the RSS after the torch import (`base`), `model` (the
# layer's ModelConfig), `tp` (rank 0 of LAYER_TENSOR), `args` (the extra arguments) and `report(**fields)`, which
# prints the fields with the peak RSS as the child's last line.
_LAYER_PREAMBLE = r"""
import json, resource, sys, time
import torch
torch.set_num_threads(1)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
from paralleljob_contract.jobfile import ModelConfig
from paralleljob_trainer.tensor_parallel import TensorParallel
mode, shape, tensor, layers, args = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
model = ModelConfig(layers, shape["hidden"], shape["heads"], 4096, 128256, shape["ffn"], "bf16", 0,
                    architecture="llama", kv_heads=shape["kv_heads"])
tp = TensorParallel(rank=0, size=tensor)

def report(**fields):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"mode": mode, **fields, "peak_rss_mib": peak / 1024, "after_import_mib": base / 1024}))
"""


def llama_layer_child(body: str, mode: str, *args: str, layers: int = 1) -> dict[str, Any]:
    """What `body` reports, run after `_LAYER_PREAMBLE` in a fresh interpreter (one thread), so that its peak RSS
    is its own; `layers` sets the model's depth (the residual projections' init scale)."""
    shape = json.dumps(LLAMA_70B_LAYER)
    command = [sys.executable, "-c", _LAYER_PREAMBLE + body, mode, shape, str(LAYER_TENSOR), str(layers), *args]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'trainer-image'}:{REPO}", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def job_document(
    pp: int, tp: int, dp: int, model: dict[str, Any], *, steps: int, batch: int, micro: int, data: dict[str, Any]
) -> dict[str, Any]:
    """The benchmarks' job: AdamW (lr 3e-4), clipping 1.0, seed 1, the trainer's default warmup."""
    return harness.job_document(
        Layout(pipeline=pp, tensor=tp, data=dp),
        optimizer=ADAMW,
        gradient_clipping=1.0,
        steps=steps,
        model=model,
        data=data,
        train_batch_size=batch,
        micro_batch_size=micro,
        seed=1,
        warmup_steps=None,
    )


def torchrun(nproc: int, module_args: list[str], env: dict[str, str] | None = None, timeout: int = 900) -> str:
    """Run `torchrun --nproc-per-node nproc ...` on 127.0.0.1 (for scripts that are not the trainer)."""
    full_env = {**harness.trainer_env(Path("unused"), Path("unused"), None, {}), **(env or {})}
    command = [
        sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1", f"--master-port={harness.free_port()}", *module_args,
    ]  # fmt: skip
    done = subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise SystemExit(f"torchrun failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def run_trainer(document: dict[str, Any], env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Train `document` with the real trainer on one node; returns its metrics.jsonl records."""
    with tempfile.TemporaryDirectory() as folder:
        job = harness.write_job(Path(folder), document)
        gang = harness.Gang()
        gang.start(job, Path(folder) / "out", nproc=document["plan"]["worldSize"], extra_env=env)
        result = gang.wait(timeout=900)
        if any(result.returncodes):
            raise SystemExit(f"trainer failed ({result.returncodes}):\n{result.logs[0][-3000:]}")
        return [record for event in ("step", "summary") for record in harness.records(Path(folder) / "out", event)]


def median_after_warmup(records: list[dict[str, Any]], field: str, warmup: int) -> float:
    values = [r[field] for r in records if r.get("event") == "step" and r["step"] > warmup]
    return statistics.median(values)


def stdlib_corpus() -> str:
    """The Python standard library's own sources: a real corpus every machine has."""
    import sysconfig

    return sysconfig.get_paths()["stdlib"] + "/json"


def gpt_175b_job(name: str, pipeline: int, tensor: int, data: int, micro_batches: int) -> ResolvedJob:
    """A validated GPT-3 175B job (ZeRO-1, full recomputation) with this layout and gradient accumulation."""
    text = f"""
apiVersion: paralleljob.io/v1alpha1
kind: ParallelJob
metadata: {{name: {name}}}
spec:
  parallelism: {{pipeline: {pipeline}, tensor: {tensor}, data: {data}}}
  model: {{layers: 96, hiddenSize: 12288, attentionHeads: 96, sequenceLength: 2048, vocabSize: 51200,
          activationCheckpointInterval: 1}}
  deepspeed: {{train_micro_batch_size_per_gpu: 1, gradient_accumulation_steps: {micro_batches},
              zero_optimization: {{stage: 1}}}}
  training: {{steps: 10}}
  checkpoint: {{intervalSteps: 5, volume: {{emptyDir: {{}}}}}}
"""
    result = validate_document(yaml.safe_load(text))
    assert result.resolved is not None, [problem.render() for problem in result.problems]
    return result.resolved


GPUS = 8


def node(i: int, gpus: int = GPUS) -> dict:
    name = f"gpu-{i:05d}"
    resources = {"nvidia.com/gpu": str(gpus), "cpu": "192", "memory": "2Ti", "pods": "110"}
    return kwok.fake_node(
        {
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            },
            "status": {"capacity": resources, "allocatable": resources},
        }
    )


def write_nodes(api: Api, count: int, fakes: kwok.Kwok, gpus: int = GPUS) -> float:
    """`count` nodes for kwok, each Ready and untainted on return; the seconds that took."""
    return kwok.write_nodes(api, [node(i, gpus) for i in range(count)], fakes, threads=16)


def write_checkpoint_claim(api: Api, namespace: str) -> None:
    """The jobs' checkpoint claim `ckpt`, bound to a volume: the scheduler leaves a pod whose claim is missing or
    unbound Pending."""
    volume = {
        "metadata": {"name": f"ckpt-{namespace}"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                 "hostPath": {"path": "/tmp/ckpt"}},
    }  # fmt: skip
    api.ok(api.send("POST", "/api/v1/persistentvolumes", volume))
    claim = {
        "metadata": {"name": "ckpt"},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": f"ckpt-{namespace}",
                 "resources": {"requests": {"storage": "1Gi"}}},
    }  # fmt: skip
    api.ok(api.send("POST", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", claim))


ADMISSION_JOB = {"parallelism": {"pipeline": 8, "tensor": 8, "data": 16}, "gpusPerNode": 8}
ADMISSION_DEEPSPEED = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16}


def daemon_pod(node: str, index: int) -> dict[str, Any]:
    """A DaemonSet-like pod as the API returns it (labels, owner, probes, env, status), CPU and memory only."""
    name = f"ds{index}-{node}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "kube-system",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": {"app.kubernetes.io/name": f"agent-{index}", "controller-revision-hash": "5d9f7c8b6"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": f"agent-{index}", "uid": "ds"}],
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "agent",
                    "image": f"registry.example.com/agent-{index}:1.2.3",
                    "env": [{"name": f"VAR_{k}", "value": "x" * 24} for k in range(8)],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                    "volumeMounts": [{"name": "host", "mountPath": "/host", "readOnly": True}],
                }
            ],
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
            "tolerations": [{"operator": "Exists"}],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": t, "status": "True"} for t in ("Initialized", "Ready", "ContainersReady")],
            "containerStatuses": [
                {
                    "name": "agent",
                    "image": f"registry.example.com/agent-{index}:1.2.3",
                    "imageID": f"registry.example.com/agent-{index}@sha256:{'0' * 64}",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {}},
                }
            ],
        },
    }


def gpu_pod(node: str) -> dict[str, Any]:
    pod = daemon_pod(node, 0)
    pod["metadata"].update(name=f"train-{node}", namespace="other-team", labels={"app": "train"})
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "8"}, "requests": {"cpu": "90"}}
    return pod


def synth_objects(nodes: int, pods_per_node: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    spec = synth.SynthSpec(nodes=nodes, gpus_per_node=8, leaves=max(1, nodes // 32), blocks=max(1, nodes // 512))
    node_dicts, _ = synth.synth_cluster(spec)
    pods = []
    for i, node in enumerate(node_dicts):
        name = node["metadata"]["name"]
        pods += [daemon_pod(name, k) for k in range(pods_per_node - 1)]
        pods.append(gpu_pod(name) if i % 2 else daemon_pod(name, pods_per_node - 1))
    return node_dicts, pods


PLACED = 20


def other_jobs(pending: int) -> list[dict[str, Any]]:
    """`pending` waiting ParallelJobs and PLACED placed ones (their records: `placed_record`)."""
    names = [f"waiting-{i}" for i in range(pending)] + [f"placed-{j}" for j in range(PLACED)]
    return [job_doc(name, namespace="queue", **ADMISSION_JOB, deepspeed=ADMISSION_DEEPSPEED) for name in names]


def placed_record(node_dicts: list[dict[str, Any]], job: dict[str, Any], index: int) -> dict[str, Any]:
    """The `-config` ConfigMap of placed job `index` (4 nodes, pods not bound yet): its attempt record, which
    reserves the nodes, owned by `job` (as created, with its uid)."""
    free = [n["metadata"]["name"] for i, n in enumerate(node_dicts) if not i % 2]
    nodes = tuple(free[-(4 * index + r + 1)] for r in range(4))
    record = records.AttemptRecord(0, job["spec"], "trainer:bench", nodes, gpus_per_node=8)
    name = job["metadata"]["name"]
    metadata = labels.child_metadata(job, labels.config_map_name(name))
    return records.stamp({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {}}, record)


def best_and_median(samples: list[float]) -> str:
    return f"best {min(samples) * 1e3:.1f} ms, median {statistics.median(samples) * 1e3:.1f} ms"


def product_steps(product: Product) -> list[dict[str, Any]]:
    """Rank 0's step records of the product's run, from its metrics.jsonl on the checkpoint volume."""
    return metrics.read_records(product.checkpoints() / "metrics" / metrics.FILE, "step")


def wait_for(what: str, predicate: Any, timeout: float = 600.0) -> Any:
    """`testcluster.polling.wait_for` with the benches' order of arguments and their 10-minute default."""
    return polling.wait_for(predicate, timeout, what)
