"""Resume at another pipeline x tensor (and data) layout: each new slice copied from the saved slices it overlaps.

A checkpoint stays in the one format every save writes (DeepSpeed's pipeline layer files, one
`mp_rank_XX_model_states.pt` per (stage, TP rank), ZeRO 1's elastic optimizer shards). When a run resumes at
another PP or TP, each rank, after its engine is built, takes from the checkpoint only the tensors of its own
parameters, in three steps:

1. find them: a parameter is named `<layer>.<tensor>` (a global pipeline layer index) or, tied,
   `tied_modules.<name>.<tensor>` (the embedding, layer 0). The saved names of a (stage, TP rank) are its
   `param_names` (every save records them with its client state) or, under ZeRO 1, DeepSpeed's `param_shapes`;
2. copy into each new slice the blocks of the saved TP slices that overlap it (`cuts.recut_plan`, with the cut
   `hf_layout`'s table gives the tensor): the weight from the layer files, AdamW's moments (and under ZeRO 1
   the fp32 master weight) from the optimizer state, cut exactly like the weight. No tensor is merged whole,
   and a saved TP rank's files are opened only when one of its slices overlaps this rank's;
3. load them: weights straight into the module's parameters; the moments and the step into the torch optimizer
   (ZeRO 0) or, under ZeRO 1, only this DP rank's partition of the flat group: the fp32 master weights written in
   place, the moments into tensors of the partition's size, handed to DeepSpeed's optimizer as the state this
   rank would have saved, which it loads without merging or cutting anything again. The learning-rate schedule
   and DeepSpeed's step counters come from rank 0's model-states file. The data position needs nothing: a
   batch is a function of the seed and the step.

Every file is memory-mapped (`torch.load(mmap=True)`) and only the overlapping blocks are copied out, so a rank
reads the pages of its own rows and columns. Re-cutting at load, rather than converting once into another
format (DeepSpeed's universal checkpoint), keeps one format on disk, works on a read-only `resumeFrom` folder
and costs nothing when the layout does not change. Mixed precision at ZeRO 0 is refused by the manifest check:
DeepSpeed's bf16/fp16 optimizer keeps its fp32 state in a form with no per-parameter names.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from paralleljob_contract.jobfile import JobConfig
from paralleljob_trainer import checkpoint, cuts, hf_layout

PARAM_NAMES = "param_names"  # the client-state key every save records: the stage's parameter names in order
_TIED_PREFIX = "tied_modules."
_TIED_LAYER = 0  # the one tied module is the token embedding, pipeline layer 0
_LEGACY_MODEL = {"architecture": "gpt", "kv_heads": None, "tie_embeddings": False}
Key = tuple[int, str]  # (global pipeline layer, tensor name in the layer's state dict)
State = tuple[dict[str, torch.Tensor], dict[str, Any]]  # (per-element state by kind, scalars such as the step)


class _Saved:
    """The files of one checkpoint, each memory-mapped the first time a re-cut reads from it."""

    def __init__(self, chosen: checkpoint.Chosen, wanted: set[Key]) -> None:
        layout = chosen.manifest["layout"]
        self.folder, self.wanted, self.zero = chosen.folder, wanted, bool(chosen.manifest.get("zeroStage"))
        self.pipeline, self.tensor, self.data = (int(layout[axis]) for axis in ("pipeline", "tensor", "data"))
        self._layers: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self._states: dict[int, dict[Key, State]] = {}

    def weight(self, key: Key, rank: int) -> torch.Tensor:
        """Saved TP rank `rank`'s slice of the weight `key`, from the layer file of its layer."""
        if (key[0], rank) not in self._layers:
            path = self.folder / f"layer_{key[0]:02d}-model_{rank:02d}-model_states.pt"
            self._layers[key[0], rank] = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return self._layers[key[0], rank][key[1]]

    def state(self, key: Key, rank: int) -> State:
        """Saved TP rank `rank`'s optimizer state of `key`: per-element tensors (shaped like the weight), scalars."""
        if rank not in self._states:
            self._states[rank] = self._read_states(rank)
        if key not in self._states[rank]:
            raise checkpoint.CheckpointError(f"the checkpoint holds no tensor {key[1]} of pipeline layer {key[0]}")
        return self._states[rank][key]

    def _read_states(self, rank: int) -> dict[Key, State]:
        """The optimizer state of the wanted tensors over every saved stage of TP rank `rank` (mp rank = stage x
        TP + TP rank, DeepSpeed's model-parallel rank within one data-parallel slice); a stage holding none of
        them is not read further than its names."""
        found: dict[Key, State] = {}
        for stage in range(self.pipeline):
            mp_rank = stage * self.tensor + rank
            states = _model_states(self.folder, mp_rank)
            if self.zero:
                by_name = _zero_state(self.folder, states, self.data, mp_rank, self.wanted)
            else:
                by_name = _torch_state(self.folder, states, mp_rank)
            for name, state in by_name.items():
                found.setdefault(key_of(name), state)  # a tied copy: the first stage's
        return found


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
    model = {**_LEGACY_MODEL, **chosen.manifest["model"]}
    named = dict(engine.module.named_parameters())
    saved = _Saved(chosen, {key_of(name) for name in named})
    tp = engine.module.tensor_parallel
    tensors = {name: _Tensor.of(model, name, parameter.shape, saved, tp) for name, parameter in named.items()}
    with torch.no_grad():
        for name, parameter in named.items():
            tensors[name].into("weight", parameter)
    if engine.zero_optimization_stage():
        _load_zero_state(engine, chosen, tensors)
    else:
        _load_torch_state(engine, named, tensors)
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


def _torch_state(folder: Path, states: Mapping[str, Any], mp_rank: int) -> dict[str, State]:
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


def _zero_state(folder: Path, states: Mapping[str, Any], data: int, mp_rank: int, wanted: set[Key]) -> dict[str, State]:
    """ZeRO 1: the wanted parameters' state in the DP shards of this (stage, TP rank), laid end to end in the order
    of `param_shapes`; views of the shards, copied only where a parameter spans two. No shard is read for a
    (stage, TP rank) that holds none of them."""
    groups = states["param_shapes"]
    if len(groups) != 1:
        raise checkpoint.CheckpointError(f"ZeRO state with {len(groups)} parameter groups; the re-cut reads one")
    if not any(key_of(name) in wanted for name in groups[0]):
        return {}
    shards = [_zero_shard(folder, data_rank, mp_rank) for data_rank in range(data)]
    flat: dict[str, list[torch.Tensor]] = {"master": [shard[checkpoint.FP32_PARTITIONS][0] for shard in shards]}
    scalars: dict[str, Any] = {}
    for kind, value in shards[0][checkpoint.BASE_OPTIMIZER_STATE][0].items():
        if torch.is_tensor(value) and value.shape == flat["master"][0].shape:
            flat[kind] = [shard[checkpoint.BASE_OPTIMIZER_STATE][0][kind] for shard in shards]
        else:
            scalars[kind] = value
    total = sum(part.numel() for part in flat["master"])
    found, offset = {}, 0
    for name, shape in groups[0].items():
        size = int(torch.Size(shape).numel())
        if offset + size > total:
            raise checkpoint.CheckpointError(f"ZeRO shards of mp rank {mp_rank} end before parameter {name}")
        if key_of(name) in wanted:
            state = {kind: _flat_range(parts, offset, offset + size).view(shape) for kind, parts in flat.items()}
            found[name] = (state, scalars)
        offset += size
    return found


def _flat_range(parts: list[torch.Tensor], start: int, stop: int) -> torch.Tensor:
    """Elements [start, stop) of `parts` laid end to end: a view when one part holds them all."""
    pieces, base = [], 0
    for part in parts:
        low, high = max(start, base), min(stop, base + part.numel())
        if low < high:
            pieces.append(part[low - base : high - base])
        base += part.numel()
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """One parameter's re-cut: the blocks of the saved TP slices that make this rank's slice of it."""

    name: str
    key: Key
    shape: torch.Size
    plan: list[cuts.Copy]
    saved: _Saved
    saved_shape: list[int]  # a saved TP slice's shape

    @classmethod
    def of(cls, model: Mapping[str, Any], name: str, shape: torch.Size, saved: _Saved, tp: Any) -> _Tensor:
        key = key_of(name)
        old, new = hf_layout.cut_of(model, key[1], saved.tensor), hf_layout.cut_of(model, key[1], tp.size)
        axis = cuts.shared_axis(old, new)
        length = new.whole_length(shape[axis], tp.size, int(model["vocab_size"]))
        saved_shape = list(shape)
        saved_shape[axis] = old.local_length(length, saved.tensor)
        return cls(name, key, shape, cuts.recut_plan(old, new, length, saved.tensor, tp), saved, saved_shape)

    def state(self) -> State:
        """The optimizer state of the saved slice the first block comes from: its kinds, and its scalars."""
        return self.saved.state(self.key, self.plan[0].source if self.plan else 0)

    def into(self, kind: str, out: torch.Tensor) -> torch.Tensor:
        """Fill `out` (shaped like this rank's slice) with this rank's slice of `kind`: the weight, or an optimizer
        state (AdamW's moments, ZeRO 1's fp32 master weight), each cut exactly like the weight."""
        return cuts.assemble_into(self.plan, out, self._reader(kind))

    def new(self, kind: str) -> torch.Tensor:
        """This rank's slice of `kind` in a tensor of its own, in the saved dtype."""
        return cuts.assemble(self.plan, self.shape, self._reader(kind), torch.float32)

    def _weight(self, rank: int) -> torch.Tensor:
        found = self.saved.weight(self.key, rank)
        if list(found.shape) != self.saved_shape:
            raise checkpoint.CheckpointError(
                f"{self.name}: TP rank {rank} saved a slice of {list(found.shape)}, this model at TP "
                f"{self.saved.tensor} holds {self.saved_shape}"
            )
        return found

    def _reader(self, kind: str) -> Callable[[int], torch.Tensor]:
        """Saved TP rank `rank`'s slice of `kind` (`rank` -> tensor)."""
        if kind == "weight":
            return self._weight
        return lambda rank: self.saved.state(self.key, rank)[0][kind]


def _load_torch_state(engine: Any, named: dict[str, Any], tensors: dict[str, _Tensor]) -> None:
    """ZeRO 0: each parameter's moments and step into the torch optimizer, as its load_state_dict would."""
    optimizer = engine.optimizer
    for name, parameter in named.items():
        state, scalars = tensors[name].state()
        optimizer.state[parameter] = {**copy.deepcopy(scalars), **{kind: tensors[name].new(kind) for kind in state}}


def _load_zero_state(engine: Any, chosen: checkpoint.Chosen, tensors: dict[str, _Tensor]) -> None:
    """ZeRO 1: this DP rank's partition of the flat group, the fp32 master weights written in place and the moments
    into tensors of the partition's size, handed to DeepSpeed's optimizer as the state this rank would have saved
    (its rigid form), which it loads as it is: no whole flat group is built, merged or cut again."""
    optimizer = engine.optimizer
    if len(optimizer.optimizer.param_groups) != 1:
        raise checkpoint.CheckpointError(
            f"a ZeRO optimizer with {len(optimizer.optimizer.param_groups)} parameter groups; the re-cut fills one"
        )
    master = optimizer.single_partition_of_fp32_groups[0]
    names = {id(parameter): name for name, parameter in engine.module.named_parameters()}
    order, offsets = optimizer.round_robin_bit16_groups[0], optimizer.round_robin_bit16_offsets[0]
    flat = [(tensors[names[id(parameter)]], offset) for parameter, offset in zip(order, offsets, strict=True)]
    state, scalars = flat[0][0].state()
    partition = {kind: master if kind == "master" else torch.empty_like(master) for kind in state}
    start = dist.get_rank(group=optimizer.real_dp_process_group[0]) * master.numel()
    with torch.no_grad():
        for kind, buffer in partition.items():
            _fill_partition(buffer, start, kind, flat)
    shard = dict(_zero_shard(chosen.folder, 0, 0))  # the global state (loss scaler, clipping, version)
    shard[checkpoint.FP32_PARTITIONS] = [master]
    moments = {kind: buffer for kind, buffer in partition.items() if kind != "master"}
    shard[checkpoint.BASE_OPTIMIZER_STATE] = {
        "state": {0: {**copy.deepcopy(scalars), **moments}},
        "param_groups": optimizer.optimizer.state_dict()["param_groups"],
    }
    shard["param_alignment_paddings"] = copy.deepcopy(optimizer.round_robin_bit16_padding)
    data_parallel = dist.get_world_size(group=optimizer.dp_process_group)
    optimizer.load_state_dict(
        state_dict_list=[shard] * data_parallel,
        load_optimizer_states=True,
        load_from_fp32_weights=engine.zero_load_from_fp32_weights(),
    )


def _fill_partition(buffer: torch.Tensor, start: int, kind: str, flat: list[tuple[_Tensor, int]]) -> None:
    """Elements [start, start + len(buffer)) of the flat group of `kind` (each tensor at its offset in it) into
    `buffer`, the alignment padding zero. A tensor wholly inside is assembled in place; one the partition's edge
    cuts, whole and then copied in part."""
    filled = 0
    for tensor, offset in flat:
        size = tensor.shape.numel()
        low, high = max(offset, start), min(offset + size, start + buffer.numel())
        if low >= high:
            continue
        buffer[filled : low - start].zero_()
        target = buffer[low - start : high - start]
        if high - low == size:
            tensor.into(kind, target.view(tensor.shape))
        else:
            target.copy_(tensor.new(kind).reshape(-1)[low - offset : high - offset])
        filled = high - start
    buffer[filled:].zero_()


def _load_schedule_and_counters(engine: Any, folder: Path) -> None:
    """The learning-rate schedule and DeepSpeed's step counters, as the saved run had them."""
    states = _model_states(folder, 0)
    if engine.lr_scheduler is not None and states.get("lr_scheduler") is not None:
        engine.lr_scheduler.load_state_dict(states["lr_scheduler"])
    engine.global_steps = states["global_steps"]
    engine.global_samples = states["global_samples"]
    engine.skipped_steps = states["skipped_steps"]
    checkpoint.learning_rate_from_scheduler(engine)
