"""One training run: process groups, the pipelined GPT under DeepSpeed, the step loop, checkpoints, metrics.

`run` is called by the CLI on every rank after the job file has been validated. It owns the order of
start-up (topology and launcher checks and the data file, all before any process group exists; the NCCL
log, distributed init with a timeout and the network verification; model, engine, resume) and the loop; the pieces it calls own the details.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.runtime.pipe.topology import ProcessTopology
from torch.distributed import distributed_c10d

from paralleljob_contract import efficiency, environment, heartbeat, stragglers
from paralleljob_contract.environment import Launch, PodEnvironment
from paralleljob_contract.jobfile import JobConfig
from paralleljob_contract.layout import Coord
from paralleljob_contract.model import training_flops
from paralleljob_trainer import (
    checkpoint,
    compute_timing,
    data,
    evaluation,
    export,
    linkcheck,
    manifest,
    metrics,
    nccl_log,
    optimization,
    preflight,
    pretrained,
    recut,
    storage,
)
from paralleljob_trainer.hooks import HookCaller, ProgressHook
from paralleljob_trainer.model import build_pipeline
from paralleljob_trainer.topology import build_topology, check_launch_matches, check_plan_matches, coords_of

VERIFY_ENV = environment.NETWORK_VERIFY
# spec.checkpoint.export's folder, inside the job's checkpoint folder.
EXPORT_FOLDER = "export"


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What the command line adds to the job file."""

    output_dir: Path | None
    checkpoint_dir: Path | None
    hooks: tuple[ProgressHook, ...] = ()
    peak_tflops: float | None = None
    # Another job's checkpoint folder (spec.checkpoint.resumeFrom), read when checkpoint_dir holds none.
    resume_from: Path | None = None


@dataclasses.dataclass
class _Progress:
    """Rolling figures for the summary line."""

    start_step: int
    last_checkpoint_step: int | None = None
    first_loss: float | None = None
    last_loss: float | None = None
    tokens: int = 0
    seconds: float = 0.0
    # The network verdict, sent with the first step record so that rank 0's progress report carries it.
    network: dict[str, str] | None = None
    # Checkpoint requests (PARALLELJOB_CHECKPOINT_REQUESTS): rank 0's hooks, asked each step.
    requests: HookCaller | None = None
    # Step times since the last logged step (its median is the record's step_seconds), and the latest ones
    # of the run (the summary's); bounded, so a long run keeps a constant memory.
    window: list[float] = dataclasses.field(default_factory=list)
    recent: collections.deque[float] = dataclasses.field(default_factory=lambda: collections.deque(maxlen=1000))
    # Each rank's compute time, compared every window; the last window's named nodes ride on the next step record.
    straggler_window: compute_timing.StragglerWindow | None = None
    stragglers: list[dict[str, Any]] | None = None


def init_distributed(env: PodEnvironment) -> None:
    """gloo on CPU, NCCL on GPU, with the contract's timeout so no rank waits forever for a dead peer."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = datetime.timedelta(seconds=env.process_group_timeout_seconds)
    # torch gives each later new_group() its backend's default timeout (gloo 30 min, NCCL 10 min), not the
    # default group's, and DeepSpeed builds its pipe and data groups without one: set the defaults first.
    distributed_c10d.default_pg_timeout = timeout
    distributed_c10d.default_pg_nccl_timeout = timeout  # type: ignore[attr-defined]  # torch does not export it
    deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def prepare_nccl_log(output_dir: Path | None) -> Path | None:
    """Before NCCL starts: its flight recorder dumps and, unless spec.network.verify is off, its INIT,NET
    lines go to <output>/nccl/ (one file per rank). None on CPU (gloo) or when the user chose the log file."""
    if not torch.cuda.is_available():
        return None
    folder = (output_dir or Path(tempfile.gettempdir())) / "nccl"
    folder.mkdir(parents=True, exist_ok=True)
    rank = os.environ.get("RANK", "0")
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(folder / "flight-recorder-rank-"))
    if os.environ.get(VERIFY_ENV, "warn") == "off":
        return None
    os.environ.update(nccl_log.nccl_debug_env(os.environ, folder / f"rank-{rank}.log"))
    chosen = os.environ["NCCL_DEBUG_FILE"]
    return None if "%" in chosen else Path(chosen)


def verify_network(log_path: Path | None) -> nccl_log.Verdict | None:
    """One warm-up all-reduce over every rank (NCCL connects its channels at the first collective), then
    NCCL's own lines against the plan; the worst verdict of any rank is the job's. Under verify: fail a
    degraded network stops every rank with that reason (NetworkNotReady, condition NetworkVerified)."""
    if log_path is None:
        return None
    dist.all_reduce(torch.ones(1, device="cuda"))
    torch.cuda.synchronize()
    expected = nccl_log.Expected.from_environment(os.environ)
    mine = nccl_log.classify(nccl_log.parse(nccl_log.read_log(log_path)), expected)
    code = torch.tensor([nccl_log.severity(mine)], device="cuda")
    dist.all_reduce(code, op=dist.ReduceOp.MAX)
    verdict = nccl_log.worst(mine, int(code.item()))
    if verdict.status == "False":
        if os.environ.get(VERIFY_ENV) == "fail":
            raise preflight.NetworkNotReady(verdict.reason, verdict.message, condition="NetworkVerified")
        metrics.log_to_stderr(f"warning: NetworkVerified=False {verdict.reason}: {verdict.message}")
    return verdict


def deepspeed_config(job: JobConfig) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The DeepSpeed config with precision set from spec.model.precision, and the optimizer to build here."""
    config, optimizer_section = optimization.split_optimizer(job.deepspeed)
    precision = job.model.precision
    config["bf16"] = {**config.get("bf16", {}), "enabled": precision == "bf16"}
    config["fp16"] = {**config.get("fp16", {}), "enabled": precision == "fp16"}
    if job.zero_stage:
        # Sharded optimizer state in DeepSpeed's elastic form, so that a resume with another DP can re-cut it.
        config["zero_optimization"] = {**config["zero_optimization"], "elastic_checkpoint": True}
    if job.sequence_parallel:
        # DeepSpeed splits the activations and gradients it sends between stages over the TP ranks and
        # gathers them on the receiver, which assumes every TP rank holds the same tensor; under sequence
        # parallelism each holds its own shard (already 1/TP of the whole).
        config["pipeline"] = {**config.get("pipeline", {}), "pipe_partitioned": False, "grad_partitioned": False}
    config.setdefault("steps_per_print", 10**9)
    config.setdefault("wall_clock_breakdown", False)
    return config, optimizer_section


def build_engine(job: JobConfig, topology: ProcessTopology, pretrained: Path | None = None) -> Any:
    """DeepSpeed's pipeline engine over the GPT; the process groups, TP's included, are DeepSpeed's grid's.
    `pretrained`: the Hugging Face folder whose weights each rank loads its slices of."""
    module = build_pipeline(job.model, job.training.seed, topology, job.sequence_parallel, pretrained)
    tp = module.tensor_parallel
    config, optimizer_section = deepspeed_config(job)
    optimizer = None
    if optimizer_section is not None:
        optimizer = optimization.build_optimizer(optimizer_section, module.parameters())
    engine, _, _, _ = deepspeed.initialize(
        model=module,
        model_parameters=module.parameters(),
        optimizer=optimizer,
        lr_scheduler=optimization.default_schedule(config, job.training),
        config=config,
    )
    optimization.record_fp32_grad_norm(engine)
    optimization.average_replicated_gradients_each_step(engine, tp)
    return engine


def run(job: JobConfig, options: RunOptions, env: PodEnvironment | None = None) -> None:
    """Train `job` on this rank to spec.training.steps, resuming from the latest checkpoint if there is one."""
    env = env or PodEnvironment.from_environ(os.environ)
    topology = build_topology(job.plan)
    launch = Launch.from_environ(os.environ)
    check_plan_matches(topology, job.plan, launch.world_size)
    check_launch_matches(job.plan, launch)
    policy = stragglers.policy_from_environ(os.environ)
    stream = data.open_stream(
        job.training.data, job.model.vocab_size, job.model.sequence_length, job.training.seed, _held_out(job)
    )
    eval_stream = data.open_eval_stream(job.training, job.model.vocab_size, job.model.sequence_length)
    check_storage(job, options, launch.rank)
    if job.pretrained is not None:
        pretrained.check_folder(job.model, job.plan.layout.tensor, job.pretrained)
    nccl_log_path = prepare_nccl_log(options.output_dir)
    init_distributed(env)
    heartbeat.beat()  # each phase on the way to the first step beats too: a hang is timed from the last one
    network = verify_network(nccl_log_path)
    started = time.perf_counter()
    chosen = checkpoint.choose(job, options.checkpoint_dir, options.resume_from)
    verify_seconds = time.perf_counter() - started
    coords = coords_of(topology, dist.get_rank())
    # A checkpoint holds the weights already: the pretrained folder is read only by a run's first start.
    engine = build_engine(job, topology, job.pretrained if chosen is None else None)
    heartbeat.beat()
    network_record = network.to_record() if network else None
    # After the groups exist, before step 1: every link of the layout timed (spec.network.preflight).
    network_record = linkcheck.check_at_start(job.plan.layout, job.plan.ranks_per_node, engine.grid, network_record)
    if policy.window_steps:
        compute_timing.attach(engine)
    heartbeat.beat()
    hooks = HookCaller(list(options.hooks))
    writer = metrics.MetricsWriter(options.output_dir, dist.get_rank() == 0, hooks)
    if network_record is not None:
        writer.write({"event": "network", **network_record})
    try:
        requests = hooks if os.environ.get(environment.CHECKPOINT_REQUESTS) == "1" else None
        progress = _Progress(start_step=0, network=network_record, requests=requests)
        if chosen is not None:
            started = time.perf_counter()
            load = recut.load if recut.changes_pipeline_or_tensor(chosen.manifest, job) else checkpoint.load
            start_step = load(engine, job, chosen)
            heartbeat.beat()
            progress = dataclasses.replace(progress, start_step=start_step, last_checkpoint_step=chosen.step)
            timings = {"verify_s": verify_seconds, "load_s": time.perf_counter() - started}
            writer.write(_resume_record(chosen, job) | timings, hook_method="on_checkpoint")
        if policy.window_steps:
            device = getattr(engine, "device", "cpu")
            progress.straggler_window = compute_timing.StragglerWindow(
                job.plan, policy.threshold, policy.window_steps, device, progress.start_step + 1, policy.windows
            )
        for step in range(progress.start_step + 1, job.training.steps + 1):
            _train_one_step(job, options, engine, (stream, eval_stream), coords, step, writer, progress)
        _export_final_checkpoint(job, options, writer)
        writer.write(_summary(job, options, progress), hook_method="on_finish")
    finally:
        writer.close()


def _held_out(job: JobConfig) -> float:
    """The fraction of each training folder's documents that spec.training.eval keeps out of training."""
    return job.training.evaluation.held_out_fraction if job.training.evaluation is not None else 0.0


def _export_final_checkpoint(job: JobConfig, options: RunOptions, writer: metrics.MetricsWriter) -> None:
    """spec.checkpoint.export: rank 0 writes the last checkpoint as a Hugging Face folder, <checkpoint>/export."""
    if job.export != "hf" or options.checkpoint_dir is None:
        return
    dist.barrier()
    if dist.get_rank() == 0:
        started = time.perf_counter()
        folder = export.export(options.checkpoint_dir, options.checkpoint_dir / EXPORT_FOLDER)
        writer.write(
            {"event": "export", "format": job.export, "path": str(folder), "export_s": time.perf_counter() - started}
        )
    dist.barrier()


def check_storage(job: JobConfig, options: RunOptions, rank: int) -> None:
    """The checkpoint folder takes a checkpoint and resumeFrom's exists, before any process group forms."""
    if options.checkpoint_dir is not None:
        storage.check_folder(options.checkpoint_dir, storage.estimated_checkpoint_bytes(job), rank)
    if options.resume_from is not None:
        storage.check_readable(options.resume_from)


def _resume_record(chosen: checkpoint.Chosen, job: JobConfig) -> dict[str, Any]:
    """The `resume` line: which checkpoint a run starts from, the layouts it was saved at and resumes at, and
    which newer ones it skipped and why."""
    if chosen.skipped:
        skipped = "; ".join(chosen.skipped)
        metrics.log_to_stderr(f"skipped checkpoints {skipped}; resuming from {chosen.folder}")
    return {
        "event": "resume",
        "step": chosen.step,
        "path": str(chosen.folder),
        "samples": chosen.manifest.get("samples"),
        "skipped": list(chosen.skipped),
        "saved_layout": manifest.layout_name(chosen.manifest["layout"]),
        "layout": manifest.layout_name(dataclasses.asdict(job.plan.layout)),
    }


def _train_one_step(
    job: JobConfig,
    options: RunOptions,
    engine: Any,
    streams: tuple[data.TokenStream, data.TokenStream | None],
    coords: Coord,
    step: int,
    writer: metrics.MetricsWriter,
    progress: _Progress,
) -> None:
    layout = job.plan.layout
    stream, eval_stream = streams
    batches = data.micro_batches(stream, step, job.train_batch_size, job.micro_batch_size, layout.data, coords.data)
    lr = float(engine.get_lr()[0])
    started = time.perf_counter()
    loss = float(engine.train_batch(data_iter=batches))
    seconds = time.perf_counter() - started
    heartbeat.beat()  # for the supervisor's progress timeout: this rank's step is done
    _compare_compute(progress, writer, step)
    tokens = job.train_batch_size * job.model.sequence_length
    progress.first_loss = loss if progress.first_loss is None else progress.first_loss
    progress.last_loss, progress.tokens, progress.seconds = loss, progress.tokens + tokens, progress.seconds + seconds
    validation = None
    if eval_stream is not None and evaluation.is_evaluation_step(job, step):
        validation = evaluation.evaluate(job, engine, eval_stream, coords)
        heartbeat.beat()
    progress.window.append(seconds)
    progress.recent.append(seconds)
    if step % job.training.log_interval == 0 or step == job.training.steps or validation is not None:
        record = _step_record(job, options, engine, step, loss, lr, seconds) | (validation or {})
        record |= _efficiency(job, options, progress.window)
        progress.window.clear()
        if progress.network is not None:
            record["network"], progress.network = progress.network, None
        if progress.stragglers is not None:
            record["stragglers"], progress.stragglers = progress.stragglers, None
        writer.write(record, hook_method="on_step")
    request = _agreed_request(progress.requests, engine) if options.checkpoint_dir else None
    if options.checkpoint_dir and (_is_checkpoint_step(job, step) or request is not None):
        started = time.perf_counter()
        saved = checkpoint.save(engine, job, options.checkpoint_dir, step)
        progress.last_checkpoint_step = step
        heartbeat.beat()
        record = {"event": "checkpoint", "step": step, "path": str(saved.folder), "bytes": saved.size}
        asked = {"request": request} if request else {}
        writer.write(record | asked | {"save_s": time.perf_counter() - started}, hook_method="on_checkpoint")


def _compare_compute(progress: _Progress, writer: metrics.MetricsWriter, step: int) -> None:
    """At a window's end: every rank's compute seconds gathered, rank 0's verdict written and kept for the
    progress channel (on the next logged step record)."""
    found = progress.straggler_window.after_step(step) if progress.straggler_window is not None else None
    if found is not None:
        writer.write(found)
        progress.stragglers = found["stragglers"]


def _agreed_request(requests: HookCaller | None, engine: Any) -> str | None:
    """Whether every rank saves a checkpoint at this step for the operator's request: rank 0 asks its hooks
    and broadcasts the answer (one integer), so all ranks save together. Rank 0 returns the request's id, the
    others "" (true-ish only for rank 0's report); None: no request, or requests are off for this job."""
    if requests is None:
        return None
    found = requests.checkpoint_request() if dist.get_rank() == 0 else None
    flag = torch.tensor([1 if found else 0], dtype=torch.int32, device=getattr(engine, "device", "cpu"))
    dist.broadcast(flag, src=0)
    if not int(flag.item()):
        return None
    return found or ""


def _is_checkpoint_step(job: JobConfig, step: int) -> bool:
    """Every spec.checkpoint.intervalSteps, and always the last step."""
    return step == job.training.steps or bool(job.checkpoint_interval and step % job.checkpoint_interval == 0)


def _step_record(
    job: JobConfig, options: RunOptions, engine: Any, step: int, loss: float, lr: float, seconds: float
) -> dict[str, Any]:
    tokens = job.train_batch_size * job.model.sequence_length
    grad_norm = engine.get_global_grad_norm()
    return {
        "event": "step",
        "step": step,
        "loss": loss,
        "lr": lr,
        "grad_norm": None if grad_norm is None else float(grad_norm),
        "tokens_per_s": tokens / seconds,
        "step_time_s": seconds,
        "samples": step * job.train_batch_size,
        # The in-pod supervisor's in-place restarts of this gang so far (0 under a plain torchrun).
        "in_place_restarts": int(os.environ.get(environment.IN_PLACE_RESTARTS, "0") or 0),
    }


def _efficiency(job: JobConfig, options: RunOptions, window: list[float]) -> dict[str, Any]:
    """TFLOP/s per GPU and MFU at the window's median step time, beside the planner's modeled step time. The
    FLOPs are the planner's formula (`paralleljob_contract.model`); MFU is null where the peak is unknown."""
    median = efficiency.median_seconds(window)
    flops = training_flops(job.model.shape, job.train_batch_size * job.model.sequence_length)
    seconds, devices = median or 0.0, job.plan.world_size
    return {
        "step_seconds": median,
        "tflops_per_gpu": efficiency.tflops_per_gpu(flops, seconds, devices),
        "mfu": efficiency.mfu(flops, seconds, devices, _peak(job, options)),
        "modeled_step_seconds": job.modeled.step_seconds if job.modeled else None,
    }


def _peak(job: JobConfig, options: RunOptions) -> float | None:
    """The device's peak: the user's (PARALLELJOB_PEAK_TFLOPS), else on a GPU the planned product's or the
    device's own from the table. A CPU has none, whatever the plan assumed."""
    if options.peak_tflops:
        return options.peak_tflops
    if not torch.cuda.is_available():
        return None
    planned = job.modeled.peak_tflops if job.modeled else None
    return planned or efficiency.peak_tflops_for(torch.cuda.get_device_name())


def _summary(job: JobConfig, options: RunOptions, progress: _Progress) -> dict[str, Any]:
    return {
        "event": "summary",
        "steps": job.training.steps,
        "resumed_from": progress.start_step or None,
        "last_checkpoint_step": progress.last_checkpoint_step,
        "first_loss": progress.first_loss,
        "last_loss": progress.last_loss,
        "tokens_per_s": progress.tokens / progress.seconds if progress.seconds else None,
        "train_time_s": progress.seconds,
        **_efficiency(job, options, list(progress.recent)),
    }


def shutdown() -> None:
    """Leave the process groups cleanly so torchrun sees every rank finish."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def abandon() -> None:
    """Leave the process groups after an error every rank has seen, without waiting for the others."""
    if dist.is_initialized():
        dist.destroy_process_group()
