"""Resume at another pipeline x tensor (and data) layout: the saved slices merged and cut again, at load time.

A checkpoint stays in the one format every save writes (DeepSpeed's pipeline layer files, one
`mp_rank_XX_model_states.pt` per (stage, TP rank), ZeRO 1's elastic optimizer shards). When a run resumes at
another PP or TP, each rank, after its engine is built, takes from the checkpoint only the tensors of its own
parameters, in three steps:

1. find them: a parameter is named `<layer>.<tensor>` (a global pipeline layer index) or, tied,
   `tied_modules.<name>.<tensor>` (the embedding, layer 0). The saved names of a (stage, TP rank) are its
   `param_names` (every save records them with its client state) or, under ZeRO 1, DeepSpeed's `param_shapes`;
2. merge each wanted tensor's saved TP slices into the whole tensor and cut it for this rank's TP rank, as
   `paralleljob_trainer.cuts` says (the export's table): the weight from the layer files, AdamW's moments
   (and under ZeRO 1 the fp32 master weight) from the optimizer state, cut exactly like the weight;
3. load them: weights into the module; the moments and the step into the torch optimizer (ZeRO 0) or, as one
   elastic shard of this (stage, TP rank), into DeepSpeed's ZeRO 1 optimizer, which cuts it for the new DP
   (`checkpoint.load_zero_shards`); the learning-rate schedule and DeepSpeed's step counters from rank 0's
   model-states file. The data position needs nothing: a batch is a function of the seed and the step.

A rank reads the layer files of its own layers only, and the optimizer files of the saved (stage, TP rank)s
memory-mapped, copying out only its tensors. Re-cutting at load, rather than converting once into another
format (DeepSpeed's universal checkpoint), keeps one format on disk, works on a read-only `resumeFrom` folder
and costs nothing when the layout does not change. Mixed precision at ZeRO 0 is refused by the manifest check:
DeepSpeed's bf16/fp16 optimizer keeps its fp32 state in a form with no per-parameter names.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from paralleljob_contract.jobfile import JobConfig
from paralleljob_trainer import checkpoint, cuts

PARAM_NAMES = "param_names"  # the client-state key every save records: the stage's parameter names in order
_TIED_PREFIX = "tied_modules."
_TIED_LAYER = 0  # the one tied module is the token embedding, pipeline layer 0
_LEGACY_MODEL = {"architecture": "gpt", "kv_heads": None, "tie_embeddings": False}
Key = tuple[int, str]  # (global pipeline layer, tensor name in the layer's state dict)
Found = dict[str, tuple[dict[str, torch.Tensor], dict[str, Any]]]  # name: (per-element state, scalars)
Pieces = dict[str, torch.Tensor]  # kind (weight, master, exp_avg, ...): this rank's slice


@dataclasses.dataclass
class _Saved:
    """One saved tensor's TP slices and its optimizer state's, by TP rank."""

    weight: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)
    state: dict[str, dict[int, torch.Tensor]] = dataclasses.field(default_factory=dict)
    scalars: dict[str, Any] = dataclasses.field(default_factory=dict)
    ranks: set[int] = dataclasses.field(default_factory=set)  # the TP ranks whose optimizer state was read


def changes_pipeline_or_tensor(saved: Mapping[str, Any], job: JobConfig) -> bool:
    """Whether the checkpoint whose manifest is `saved` was saved at another PP or TP than `job` runs."""
    layout = saved.get("layout") or {}
    return (layout.get("pipeline"), layout.get("tensor")) != (job.plan.layout.pipeline, job.plan.layout.tensor)


def key_of(name: str) -> Key:
    """The (layer, tensor) of a parameter named by the pipeline module."""
    if name.startswith(_TIED_PREFIX):
        return _TIED_LAYER, name[len(_TIED_PREFIX) :].split(".", 1)[1]
    layer, tensor = name.split(".", 1)
    return int(layer), tensor


def load(engine: Any, job: JobConfig, chosen: checkpoint.Chosen) -> int:
    """Load the checkpoint saved at another layout into `engine` (see the module docstring); returns its step."""
    try:
        _load(engine, chosen)
    except (checkpoint.CheckpointError, cuts.CutError, KeyError, OSError, RuntimeError, ValueError) as error:
        first = str(error).strip().splitlines()[0][:240] if str(error).strip() else type(error).__name__
        raise checkpoint.CheckpointError(f"cannot re-cut checkpoint {chosen.folder}: {first}") from error
    return chosen.step


def _load(engine: Any, chosen: checkpoint.Chosen) -> None:
    saved_layout = chosen.manifest["layout"]
    model = {**_LEGACY_MODEL, **chosen.manifest["model"]}
    named = dict(engine.module.named_parameters())
    wanted = {key_of(name) for name in named}
    saved = _read_optimizer_state(chosen, saved_layout, wanted)
    _read_weights(chosen.folder, int(saved_layout["tensor"]), saved)
    tp = engine.module.tensor_parallel
    pieces = {name: _recut(model, key_of(name), saved, int(saved_layout["tensor"]), tp) for name in named}
    for name, parameter in named.items():
        weight = pieces[name]["weight"]
        if weight.shape != parameter.shape:
            raise checkpoint.CheckpointError(
                f"{name} re-cut to {tuple(weight.shape)}, the model holds {tuple(parameter.shape)}"
            )
        with torch.no_grad():
            parameter.copy_(weight)
    if engine.zero_optimization_stage():
        _load_zero_state(engine, chosen, pieces, saved)
    else:
        _load_torch_state(engine, named, pieces, saved)
    _load_schedule_and_counters(engine, chosen.folder)


def _model_states(folder: Path, mp_rank: int) -> dict[str, Any]:
    path = folder / f"mp_rank_{mp_rank:02d}_model_states.pt"
    loaded: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    return loaded


def _zero_shard(folder: Path, data_rank: int, mp_rank: int) -> dict[str, Any]:
    path = folder / f"zero_pp_rank_{data_rank}_mp_rank_{mp_rank:02d}_optim_states.pt"
    loaded = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    shard: dict[str, Any] = loaded[checkpoint.OPTIMIZER_STATE_DICT]
    return shard


def _read_optimizer_state(chosen: checkpoint.Chosen, layout: Mapping[str, int], wanted: set[Key]) -> dict[Key, _Saved]:
    """The optimizer state of the wanted tensors, from every saved (stage, TP rank): mp rank = stage x TP + TP
    rank (DeepSpeed's model-parallel rank within one data-parallel slice)."""
    saved: dict[Key, _Saved] = {}
    tensor = int(layout["tensor"])
    for mp_rank in range(int(layout["pipeline"]) * tensor):
        states = _model_states(chosen.folder, mp_rank)
        if chosen.manifest.get("zeroStage"):
            found = _zero_state(chosen.folder, states, int(layout["data"]), mp_rank)
        else:
            found = _torch_state(chosen.folder, states, mp_rank)
        for name, (state, scalars) in found.items():
            key = key_of(name)
            if key not in wanted or mp_rank % tensor in saved.get(key, _Saved()).ranks:
                continue  # not this rank's, or a tied copy already read from the first stage
            entry = saved.setdefault(key, _Saved())
            for kind, value in state.items():
                entry.state.setdefault(kind, {})[mp_rank % tensor] = value.clone()
            entry.scalars |= scalars
            entry.ranks.add(mp_rank % tensor)
    return saved


def _torch_state(folder: Path, states: Mapping[str, Any], mp_rank: int) -> Found:
    """ZeRO 0: the torch optimizer's state of each parameter, by the names the save recorded."""
    names = states.get(PARAM_NAMES)
    if names is None:
        raise checkpoint.CheckpointError(
            f"{folder / f'mp_rank_{mp_rank:02d}_model_states.pt'} records no parameter names (saved by an older "
            "trainer); resume it at the pipeline and tensor sizes it was saved at"
        )
    per_index = states["optimizer"]["state"]
    found = {}
    for index, name in enumerate(names):
        state = per_index.get(index, {})
        tensors = {kind: value for kind, value in state.items() if torch.is_tensor(value) and value.dim() > 0}
        found[name] = (tensors, {kind: value for kind, value in state.items() if kind not in tensors})
    return found


def _zero_state(folder: Path, states: Mapping[str, Any], data: int, mp_rank: int) -> Found:
    """ZeRO 1: the DP shards of this (stage, TP rank) merged into flat groups, then cut by `param_shapes`."""
    groups = states["param_shapes"]
    if len(groups) != 1:
        raise checkpoint.CheckpointError(f"ZeRO state with {len(groups)} parameter groups; the re-cut reads one")
    shards = [_zero_shard(folder, data_rank, mp_rank) for data_rank in range(data)]
    partitions = [shard[checkpoint.FP32_PARTITIONS][0] for shard in shards]
    flat = {"master": torch.cat(partitions)}
    scalars = {}
    for kind, value in shards[0][checkpoint.BASE_OPTIMIZER_STATE][0].items():
        if torch.is_tensor(value) and value.shape == partitions[0].shape:
            flat[kind] = torch.cat([shard[checkpoint.BASE_OPTIMIZER_STATE][0][kind] for shard in shards])
        else:
            scalars[kind] = value
    found, offset = {}, 0
    for name, shape in groups[0].items():
        size = int(torch.Size(shape).numel())
        if offset + size > flat["master"].numel():
            raise checkpoint.CheckpointError(f"ZeRO shards of mp rank {mp_rank} end before parameter {name}")
        found[name] = ({kind: value[offset : offset + size].view(shape) for kind, value in flat.items()}, scalars)
        offset += size
    return found


def _read_weights(folder: Path, tensor: int, saved: dict[Key, _Saved]) -> None:
    """Each wanted tensor's weight slices, from the layer files of the wanted layers only."""
    for layer in sorted({layer for layer, _ in saved}):
        for rank in range(tensor):
            path = folder / f"layer_{layer:02d}-model_{rank:02d}-model_states.pt"
            states = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            for (wanted_layer, name), entry in saved.items():
                if wanted_layer == layer:
                    entry.weight[rank] = states[name].clone()


def _recut(model: Mapping[str, Any], key: Key, saved: dict[Key, _Saved], old_tensor: int, tp: Any) -> Pieces:
    """This rank's slice of the weight and of each optimizer state of `key`."""
    if key not in saved:
        raise checkpoint.CheckpointError(f"the checkpoint holds no tensor {key[1]} of pipeline layer {key[0]}")
    entry, vocab = saved[key], int(model["vocab_size"])
    old, new = cuts.cut_of(model, key[1], old_tensor), cuts.cut_of(model, key[1], tp.size)

    def recut(slices: dict[int, torch.Tensor]) -> torch.Tensor:
        whole = cuts.merge(old, [slices[rank] for rank in range(old_tensor)], vocab)
        return cuts.split(new, whole, tp.size, tp.rank)

    return {"weight": recut(entry.weight), **{kind: recut(slices) for kind, slices in entry.state.items()}}


def _load_torch_state(engine: Any, named: dict[str, Any], pieces: dict[str, Pieces], saved: dict[Key, _Saved]) -> None:
    """ZeRO 0: each parameter's moments and step into the torch optimizer, as its load_state_dict would."""
    optimizer = engine.optimizer
    for name, parameter in named.items():
        state = {kind: value for kind, value in pieces[name].items() if kind != "weight"}
        scalars = {kind: copy.deepcopy(value) for kind, value in saved[key_of(name)].scalars.items()}
        optimizer.state[parameter] = {**scalars, **state}


def _load_zero_state(
    engine: Any, chosen: checkpoint.Chosen, pieces: dict[str, Pieces], saved: dict[Key, _Saved]
) -> None:
    """ZeRO 1: this (stage, TP rank)'s whole flat group as one elastic shard, which the optimizer cuts for DP."""
    order = list(engine._get_zero_param_shapes()[0])
    template = _zero_shard(chosen.folder, 0, 0)
    shard = dict(template)  # the global state (loss scaler, clipping, version) is the same on every rank
    shard[checkpoint.FP32_PARTITIONS] = [torch.cat([pieces[name]["master"].reshape(-1) for name in order])]
    kinds = [kind for kind in pieces[order[0]] if kind not in ("weight", "master")]
    state = {kind: torch.cat([pieces[name][kind].reshape(-1) for name in order]) for kind in kinds}
    shard[checkpoint.BASE_OPTIMIZER_STATE] = [{**saved[key_of(order[0])].scalars, **state}]
    shard.pop(checkpoint.BASE_OPTIMIZER_STATE_STEP, None)
    if hasattr(engine.optimizer, "round_robin_bit16_padding"):
        shard["param_alignment_paddings"] = copy.deepcopy(engine.optimizer.round_robin_bit16_padding)
    checkpoint.load_zero_shards(engine, [shard])


def _load_schedule_and_counters(engine: Any, folder: Path) -> None:
    """The learning-rate schedule and DeepSpeed's step counters, as the saved run had them."""
    states = _model_states(folder, 0)
    if engine.lr_scheduler is not None and states.get("lr_scheduler") is not None:
        engine.lr_scheduler.load_state_dict(states["lr_scheduler"])
    engine.global_steps = states["global_steps"]
    engine.global_samples = states["global_samples"]
    engine.skipped_steps = states["skipped_steps"]
    checkpoint.learning_rate_from_scheduler(engine)
