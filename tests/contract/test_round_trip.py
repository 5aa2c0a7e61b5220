"""What the operator writes, the trainer reads: the ConfigMap's job file and each pod's environment parse in
the contract's readers, and every rank finds there the place the plan gave it.

No process is started: the job file comes out of the ConfigMap the operator builds, the environment out of
the pod it builds, and torchrun's own variables are the ones it would set for each local rank. Every example
and hypothesis-generated valid jobs go through it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paralleljob import planning
from paralleljob.api import ResolvedJob, validate_document
from paralleljob.local.shape import choose_locally, choose_shape, plan_locally
from paralleljob.manifests import children, configmap
from paralleljob_contract import dataset, environment, jobfile
from paralleljob_contract.environment import Launch, PodEnvironment
from paralleljob_contract.layout import global_rank, tensor_fits

REPO = Path(__file__).resolve().parents[2]
# deepspeed-zero2-pipeline.yaml shows a job the API refuses (ZeRO-2 under the pipeline engine).
REFUSED_ON_PURPOSE = {"deepspeed-zero2-pipeline"}
EXAMPLES = sorted(
    p
    for p in (REPO / "examples").rglob("*.yaml")
    if "kind: ParallelJob" in p.read_text() and p.stem not in REFUSED_ON_PURPOSE
)
OWNER_UID = "u-1"


def resolved_of(document: dict[str, Any]) -> ResolvedJob:
    """The job the operator builds objects for: a job that gives a GPU budget gets its layout chosen first,
    as at its first admission (here on the local shape, as `paralleljob run` chooses)."""
    result = validate_document(document)
    assert result.resolved is not None, [p.render() for p in result.problems]
    if not result.resolved.needs_layout:
        return result.resolved
    chosen = choose_locally(result.resolved, None, None)
    assert not isinstance(chosen, str), chosen
    return chosen[0].winner.job


def operator_objects(resolved: ResolvedJob) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """The ConfigMap and pods the operator builds for `resolved`, planned on simulated nodes."""
    plan = plan_locally(resolved, choose_shape(resolved, None, None))
    assert isinstance(plan, planning.Plan), plan
    plan_dict = plan.to_dict()
    owner = {"metadata": {"name": resolved.name, "namespace": resolved.namespace, "uid": OWNER_UID}}
    config_map = children.build_attempt(owner, resolved, plan, [], attempt=0).config_map
    names = [node.node for node in plan.nodes]
    pods = children.build_children(owner, resolved, config_map, names, image="trainer:1").pods
    return config_map, pods, plan_dict


def pod_environ(pod: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in pod["spec"]["containers"][0]["env"] if "value" in item}


def torchrun_environ(pod: dict[str, Any], local_rank: int) -> dict[str, str]:
    """What torchrun adds for one of its processes, read off the pod's own command line."""
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in pod["spec"]["containers"][0]["command"] if "=" in arg)
    nodes, node_rank, per_node = int(flags["nnodes"]), int(flags["node-rank"]), int(flags["nproc-per-node"])
    rank = global_rank(node_rank, per_node, local_rank)
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(nodes * per_node),
        "LOCAL_WORLD_SIZE": str(per_node),
    }


def job_file_with_local_data(config_map: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """job.json as the pods mount it; a data path inside the pod is pointed at a file here, which the reader
    checks exists."""
    document = json.loads(config_map["data"][configmap.JOB_FILE])
    data = document["spec"]["training"].get("data") or {}
    if data.get("path") and data.get("source") == "tokens":
        data["path"] = str(prepared_folder(tmp / "prepared"))
    elif data.get("path"):
        local = tmp / "data.bin"
        local.write_bytes(bytes(range(256)) * 64)
        data["path"] = str(local)
    model = document["spec"]["model"]
    if model.get("pretrained"):
        model["pretrained"]["path"] = str(llama_config_folder(model, tmp / "hf"))
    return document


def prepared_folder(folder: Path) -> Path:
    """A small folder in the layout `paralleljob data prepare` writes: 64 documents of 256 uint16 ids."""
    folder.mkdir(exist_ok=True)
    (folder / dataset.TOKENS_FILE).write_bytes(np.tile(np.arange(256, dtype=np.uint16), 64).tobytes())
    (folder / dataset.OFFSETS_FILE).write_bytes(np.arange(0, 256 * 65, 256, dtype=np.uint64).tobytes())
    metadata = {
        "format": dataset.FORMAT,
        "version": dataset.VERSION,
        "dtype": "uint16",
        "documents": 64,
        "tokens": 256 * 64,
        "tokenizer": {"vocabSize": 256, "endOfDocumentId": 255},
    }
    (folder / dataset.METADATA_FILE).write_text(json.dumps(metadata))
    return folder


def llama_config_folder(model: dict[str, Any], folder: Path) -> Path:
    """A folder whose config.json is the LlamaForCausalLM of the job's model section (a pod's pretrained path)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": model["layers"],
        "hidden_size": model["hiddenSize"],
        "num_attention_heads": model["attentionHeads"],
        "num_key_value_heads": model.get("kvHeads") or model["attentionHeads"],
        "vocab_size": model["vocabSize"],
        "intermediate_size": model["ffnHiddenSize"],
        "rope_theta": model["ropeTheta"],
        "tie_word_embeddings": model["tieEmbeddings"],
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def assert_round_trip(resolved: ResolvedJob, tmp: Path) -> None:
    config_map, pods, plan_dict = operator_objects(resolved)
    job = jobfile.parse_job_config(job_file_with_local_data(config_map, tmp))
    assert (job.pretrained is not None) == (resolved.spec.model.pretrained is not None)
    layout = job.plan.layout
    assert (layout.pipeline, layout.tensor, layout.data) == (resolved.pipeline, resolved.tensor, resolved.data)
    assert list(layout.axis_order) == plan_dict["axisOrder"]
    assert job.plan.nodes == len(pods) and job.plan.ranks_per_node == plan_dict["ranksPerNode"]
    assert job.train_batch_size == resolved.batch.train_batch_size
    assert job.model.ffn_hidden_size == resolved.ffn_hidden_size
    assert job.training.warmup_steps == resolved.warmup_steps
    assert tensor_fits(layout.tensor, job.plan.ranks_per_node, plan_dict.get("nvlinkDomainLabel") is not None)
    planned = {node["nodeRank"]: node for node in plan_dict["nodes"]}
    for node_rank, pod in enumerate(pods):
        env = PodEnvironment.from_environ(pod_environ(pod), required=(environment.NODE_RANK, environment.JOB_NAME))
        assert (env.node_rank, env.node_name, env.config_path) == (
            node_rank,
            planned[node_rank]["node"],
            configmap.CONFIG_PATH,
        )
        for local_rank in (0, job.plan.ranks_per_node - 1):
            launch = Launch.from_environ({**pod_environ(pod), **torchrun_environ(pod, local_rank)})
            assert launch.world_size == job.plan.world_size
            # The rank the contract derives sits where the planner put it.
            index = planned[node_rank]["ranks"].index(launch.rank)
            assert layout.coord(launch.rank)._asdict() == planned[node_rank]["coords"][index]


@pytest.mark.parametrize("example", EXAMPLES, ids=[str(p.relative_to(REPO / "examples")) for p in EXAMPLES])
def test_every_example_round_trips_from_the_operator_to_the_trainers_reader(example: Path, tmp_path: Path) -> None:
    assert_round_trip(resolved_of(yaml.safe_load(example.read_text())), tmp_path)


@st.composite
def valid_jobs(draw: st.DrawFn) -> dict[str, Any]:
    """Small valid jobs a user could write: a layout, a model that splits over it, a batch, gpusPerNode."""
    pipeline = draw(st.sampled_from([1, 2, 4]))
    tensor = draw(st.sampled_from([1, 2, 4]))
    data = draw(st.sampled_from([1, 2, 3]))
    heads = tensor * draw(st.sampled_from([1, 2]))
    micro = draw(st.sampled_from([1, 2]))
    spec: dict[str, Any] = {
        "parallelism": {"pipeline": pipeline, "tensor": tensor, "data": data},
        "gpusPerNode": tensor * draw(st.sampled_from([1, 2])),
        "model": {
            "layers": pipeline * draw(st.sampled_from([1, 2])),
            "hiddenSize": 16 * heads,
            "attentionHeads": heads,
            "sequenceLength": draw(st.sampled_from([32, 64])),
            "vocabSize": draw(st.sampled_from([256, 1000])),
            "precision": draw(st.sampled_from(["bf16", "fp32"])),
        },
        "deepspeed": {
            "train_micro_batch_size_per_gpu": micro,
            "gradient_accumulation_steps": draw(st.sampled_from([1, 4])),
        },
        "training": {"steps": draw(st.integers(1, 2000))},
        "topology": {"axisOrder": draw(st.sampled_from(["pipe,data,model", "data,pipe,model"]))},
    }
    world = pipeline * tensor * data
    if world % spec["gpusPerNode"]:
        spec["gpusPerNode"] = tensor
    if world % spec["gpusPerNode"]:
        del spec["gpusPerNode"]
    if draw(st.booleans()):
        volume = {"persistentVolumeClaim": {"claimName": "checkpoints"}}
        spec["checkpoint"] = {"intervalSteps": draw(st.integers(1, 100)), "volume": volume}
    return {"apiVersion": "paralleljob.io/v1alpha1", "kind": "ParallelJob", "metadata": {"name": "gen"}, "spec": spec}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=valid_jobs())
def test_generated_valid_jobs_round_trip(document: dict[str, Any], tmp_path: Path) -> None:
    assert_round_trip(resolved_of(document), tmp_path)
