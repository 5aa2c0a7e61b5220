"""A Hugging Face folder's config.json against spec.model: the section it implies, and the job's agreement with it.

`spec_model(config)` is the spec.model section of a LlamaForCausalLM or GPT2LMHeadModel folder (what
`paralleljob model-spec DIR` prints). `disagreement(section, config)` names the first field where a job's
spec.model differs, with both values and the fix, in one line; `paralleljob validate` and every rank (through
`applied`, called by the job-file reader before any process group forms) use it. What spec.model does not
carry (norm epsilon, Llama 3.1's rope_scaling, GPT-2's gelu_new) is taken from config.json (`extras`).
Standard library only: the operator's CLI and the trainer both read it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paralleljob_contract.errors import ContractError
from paralleljob_contract.model import RopeScaling, default_ffn_hidden_size

if TYPE_CHECKING:
    from paralleljob_contract.jobfile import ModelConfig

CONFIG_FILE = "config.json"
FIELD = "spec.model.pretrained.path"
ARCHITECTURES = {"LlamaForCausalLM": "llama", "GPT2LMHeadModel": "gpt"}
GPT2_ACTIVATIONS = ("gelu", "gelu_new")
# The fields a job must agree on, in the order they are checked; the others (precision, sequenceLength, ...)
# are the job's own choice.
COMPARED = ("architecture", "layers", "hiddenSize", "attentionHeads", "kvHeads", "vocabSize", "ffnHiddenSize")
LLAMA_COMPARED = ("ropeTheta", "tieEmbeddings")


def pretrained_path(section: Mapping[str, Any]) -> Path | None:
    """spec.model.pretrained.path, user-expanded; None when the job starts from random weights."""
    pretrained = section.get("pretrained")
    if pretrained is None:
        return None
    if not isinstance(pretrained, Mapping) or not isinstance(pretrained.get("path"), str) or not pretrained["path"]:
        raise ContractError(f"{FIELD}: must be the path of a Hugging Face folder, got {pretrained!r}")
    return Path(os.path.expanduser(pretrained["path"]))


def read(folder: Path) -> dict[str, Any]:
    """config.json of `folder`, or ContractError naming the file."""
    path = folder / CONFIG_FILE
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ContractError(f"{FIELD}: {path} does not exist; the folder needs config.json and *.safetensors") from None
    except (OSError, json.JSONDecodeError) as error:
        raise ContractError(f"{FIELD}: {path} is not readable JSON: {error}") from None
    if not isinstance(config, dict):
        raise ContractError(f"{FIELD}: {path} must hold a JSON object")
    return config


def architecture(config: Mapping[str, Any]) -> str:
    """The trainer's architecture for config.json's `architectures`; ContractError for any other."""
    names = config.get("architectures") or []
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    known = ", ".join(ARCHITECTURES)
    raise ContractError(f"{FIELD}: config.json's architectures {names} is none this trainer maps ({known})")


def spec_model(config: Mapping[str, Any]) -> dict[str, Any]:
    """The spec.model section (camelCase, as in a ParallelJob) of the folder whose config.json is `config`."""
    if architecture(config) == "llama":
        heads = int(config["num_attention_heads"])
        return {
            "architecture": "llama",
            "layers": int(config["num_hidden_layers"]),
            "hiddenSize": int(config["hidden_size"]),
            "attentionHeads": heads,
            "kvHeads": int(config.get("num_key_value_heads") or heads),
            "sequenceLength": int(config.get("max_position_embeddings", 2048)),
            "vocabSize": int(config["vocab_size"]),
            "ffnHiddenSize": int(config["intermediate_size"]),
            "ropeTheta": float(_rope(config).get("rope_theta", 10000.0)),
            "tieEmbeddings": bool(config.get("tie_word_embeddings", False)),
        }
    hidden = int(config.get("n_embd", 768))
    return {
        "architecture": "gpt",
        "layers": int(config.get("n_layer", 12)),
        "hiddenSize": hidden,
        "attentionHeads": int(config.get("n_head", 12)),
        "sequenceLength": int(config.get("n_positions", 1024)),
        "vocabSize": int(config.get("vocab_size", 50257)),
        "ffnHiddenSize": int(config.get("n_inner") or 4 * hidden),
    }


def _resolved(section: Mapping[str, Any]) -> dict[str, Any]:
    """A spec.model section with the defaults the job-file reader gives its absent fields."""
    architecture_name = section.get("architecture", "gpt")
    hidden, heads = section.get("hiddenSize"), section.get("attentionHeads")
    defaults = {
        "architecture": "gpt",
        "kvHeads": heads if architecture_name == "llama" else None,
        "ffnHiddenSize": default_ffn_hidden_size(int(hidden), architecture_name) if hidden else None,
        "ropeTheta": 10000.0,
        "tieEmbeddings": False,
    }
    return {**defaults, **{key: value for key, value in section.items() if value is not None}}


def disagreement(section: Mapping[str, Any], config: Mapping[str, Any], folder: Path) -> str | None:
    """The first spec.model field that differs from the folder's config.json, in one line with the fix."""
    wanted, found = spec_model(config), _resolved(section)
    fields = COMPARED + (LLAMA_COMPARED if wanted["architecture"] == "llama" else ())
    for key in fields:
        if key in wanted and found.get(key) != wanted[key]:
            return (
                f"spec.model.{key} is {found.get(key)!r} but {folder / CONFIG_FILE} says {wanted[key]!r}; set "
                f"{key}: {json.dumps(wanted[key])} (`paralleljob model-spec {folder}` prints the whole section)"
            )
    if wanted["architecture"] == "gpt" and int(found.get("sequenceLength", 0)) > wanted["sequenceLength"]:
        return (
            f"spec.model.sequenceLength is {found['sequenceLength']} but {folder / CONFIG_FILE} has only "
            f"{wanted['sequenceLength']} learned positions (n_positions); set sequenceLength to at most that"
        )
    return None


def extras(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields spec.model does not carry: norm epsilon, rope scaling, GPT-2's activation.
    ContractError for a setting the trainer's layers cannot reproduce."""
    if architecture(config) == "gpt":
        activation = config.get("activation_function", "gelu_new")
        if activation not in GPT2_ACTIVATIONS:
            raise ContractError(f"{FIELD}: config.json's activation_function {activation!r} is not gelu or gelu_new")
        return {"norm_eps": float(config.get("layer_norm_epsilon", 1e-5)), "activation": activation}
    _check_llama_fixed(config)
    return {"norm_eps": float(config.get("rms_norm_eps", 1e-6)), "rope_scaling": _rope_scaling(config)}


def _check_llama_fixed(config: Mapping[str, Any]) -> None:
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    unsupported = {
        "hidden_act": (config.get("hidden_act", "silu"), "silu"),
        "attention_bias": (bool(config.get("attention_bias", False)), False),
        "mlp_bias": (bool(config.get("mlp_bias", False)), False),
        "head_dim": (int(config.get("head_dim") or hidden // heads), hidden // heads),
    }
    for key, (value, needed) in unsupported.items():
        if value != needed:
            raise ContractError(f"{FIELD}: config.json's {key} is {value!r}; this trainer's llama needs {needed!r}")


def _rope(config: Mapping[str, Any]) -> dict[str, Any]:
    """RoPE's theta and scaling: transformers 5's rope_parameters, or the older rope_theta and rope_scaling."""
    if isinstance(config.get("rope_parameters"), Mapping):
        return dict(config["rope_parameters"])
    return {**(config.get("rope_scaling") or {}), "rope_theta": config.get("rope_theta", 10000.0)}


def _rope_scaling(config: Mapping[str, Any]) -> RopeScaling | None:
    scaling = _rope(config)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise ContractError(f"{FIELD}: config.json's rope_scaling type {kind!r} is not one this trainer maps (llama3)")
    try:
        return RopeScaling(
            float(scaling["factor"]),
            float(scaling["low_freq_factor"]),
            float(scaling["high_freq_factor"]),
            int(scaling["original_max_position_embeddings"]),
        )
    except KeyError as missing:
        raise ContractError(f"{FIELD}: config.json's rope_scaling has no {missing}") from None


def applied(model: ModelConfig, section: Mapping[str, Any]) -> tuple[ModelConfig, Path | None]:
    """`model` with the folder's extras, and the folder; ContractError when the folder is missing, cannot be
    mapped or disagrees with spec.model. `model` unchanged when the job has no pretrained folder."""
    folder = pretrained_path(section)
    if folder is None:
        return model, None
    if not folder.is_dir():
        raise ContractError(f"{FIELD}: {folder} is not a folder (mount it with spec.template.volumes)")
    config = read(folder)
    problem = disagreement(section, config, folder)
    if problem:
        raise ContractError(problem)
    return dataclasses.replace(model, **extras(config)), folder
