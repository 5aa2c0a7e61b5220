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
3. load them: weights into the module; the moments and the step into the torch optimizer (ZeRO 0) or, as one
   elastic shard of this (stage, TP rank), into DeepSpeed's ZeRO 1 optimizer, which cuts it for the new DP
   (`checkpoint.load_zero_shards`); the learning-rate schedule and DeepSpeed's step counters from rank 0's
   model-states file. The data position needs nothing: a batch is a function of the seed and the step.

Every file is memory-mapped (`torch.load(mmap=True)`) and only the overlapping blocks are copied out, so a rank
reads the pages of its own rows and columns. Re-cutting at load, rather than converting once into another
format (DeepSpeed's universal checkpoint), keeps one format on disk, works on a read-only `resumeFrom` folder
and costs nothing when the layout does not change. Mixed precision at ZeRO 0 is refused by the manifest check:
DeepSpeed's bf16/fp16 optimizer keeps its fp32 state in a form with no per-parameter names.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from paralleljob_contract.jobfile import JobConfig
from paralleljob_trainer import checkpoint, cuts, hf_layout

PARAM_NAMES = "param_names"  # the client-state key every save records: the stage's parameter names in order
_TIED_PREFIX = "tied_modules."
_TIED_LAYER = 0  # the one tied module is the token embedding, pipeline layer 0
_LEGACY_MODEL = {"architecture": "gpt", "kv_heads": None, "tie_embeddings": False}
Key = tuple[int, str]  # (global pipeline layer, tensor name in the layer's state dict)
State = tuple[dict[str, torch.Tensor], dict[str, Any]]  # (per-element state by kind, scalars such as the step)
Pieces = dict[str, torch.Tensor]  # kind (weight, master, exp_avg, ...): this rank's slice


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
    pieces: dict[str, Pieces] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for name, parameter in named.items():
        pieces[name], scalars[name] = _recut(model, name, parameter, saved, tp)
        with torch.no_grad():
            parameter.copy_(pieces[name]["weight"])
    if engine.zero_optimization_stage():
        _load_zero_state(engine, chosen, pieces, scalars)
    else:
        _load_torch_state(engine, named, pieces, scalars)
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


def _recut(
    model: Mapping[str, Any], name: str, parameter: torch.Tensor, saved: _Saved, tp: Any
) -> tuple[Pieces, dict[str, Any]]:
    """This rank's slice of the weight `name` and of each of its optimizer states, and the states' scalars."""
    key = key_of(name)
    old, new = hf_layout.cut_of(model, key[1], saved.tensor), hf_layout.cut_of(model, key[1], tp.size)
    axis = cuts.shared_axis(old, new)
    length = new.whole_length(parameter.shape[axis], tp.size, int(model["vocab_size"]))
    plan = cuts.recut_plan(old, new, length, saved.tensor, tp)
    expected = list(parameter.shape)
    expected[axis] = old.local_length(length, saved.tensor)

    def weight(rank: int) -> torch.Tensor:
        found = saved.weight(key, rank)
        if list(found.shape) != expected:
            raise checkpoint.CheckpointError(
                f"{name}: TP rank {rank} saved a slice of {list(found.shape)}, this model at TP {saved.tensor} "
                f"holds {expected}"
            )
        return found

    def state_of(kind: str) -> Callable[[int], torch.Tensor]:
        return lambda rank: saved.state(key, rank)[0][kind]

    state, scalars = saved.state(key, plan[0].source if plan else 0)
    pieces = {"weight": cuts.assemble(plan, parameter.shape, weight, parameter.dtype)}
    for kind in state:
        pieces[kind] = cuts.assemble(plan, parameter.shape, state_of(kind), torch.float32)
    return pieces, dict(scalars)


def _load_torch_state(
    engine: Any, named: dict[str, Any], pieces: dict[str, Pieces], scalars: dict[str, dict[str, Any]]
) -> None:
    """ZeRO 0: each parameter's moments and step into the torch optimizer, as its load_state_dict would."""
    optimizer = engine.optimizer
    for name, parameter in named.items():
        state = {kind: value for kind, value in pieces[name].items() if kind != "weight"}
        optimizer.state[parameter] = {**copy.deepcopy(scalars[name]), **state}


def _load_zero_state(
    engine: Any, chosen: checkpoint.Chosen, pieces: dict[str, Pieces], scalars: dict[str, dict[str, Any]]
) -> None:
    """ZeRO 1: this (stage, TP rank)'s whole flat group as one elastic shard, which the optimizer cuts for DP."""
    order = list(engine._get_zero_param_shapes()[0])
    template = _zero_shard(chosen.folder, 0, 0)
    shard = dict(template)  # the global state (loss scaler, clipping, version) is the same on every rank
    shard[checkpoint.FP32_PARTITIONS] = [torch.cat([pieces[name]["master"].reshape(-1) for name in order])]
    kinds = [kind for kind in pieces[order[0]] if kind not in ("weight", "master")]
    state = {kind: torch.cat([pieces[name][kind].reshape(-1) for name in order]) for kind in kinds}
    shard[checkpoint.BASE_OPTIMIZER_STATE] = [{**scalars[order[0]], **state}]
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
