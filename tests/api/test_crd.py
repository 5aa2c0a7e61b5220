"""The CRD is generated from the API types, committed, documented field by field, and accepts the examples."""

from __future__ import annotations

import pathlib

import jsonschema
import kubernetes_validate
import pytest
import yaml

from paralleljob.api import crd
from paralleljob.commands import crd as crd_command

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted(path for path in (ROOT / "examples").glob("*.yaml") if "kind: ParallelJob" in path.read_text())


def walk(schema: dict, path: str = ""):
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from walk(prop, f"{path}.{name}")
    if "items" in schema:
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def strip_kubernetes_extensions(schema):
    if isinstance(schema, dict):
        return {k: strip_kubernetes_extensions(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
    if isinstance(schema, list):
        return [strip_kubernetes_extensions(v) for v in schema]
    return schema


def test_the_committed_crd_is_what_paralleljob_crd_generates() -> None:
    committed = (ROOT / crd.CRD_FILE).read_text()
    assert committed == crd_command.render(), (
        "crds/ drifted from the API types: run `paralleljob crd > crds/paralleljob.io_paralleljobs.yaml`"
    )


def test_every_spec_and_status_field_has_a_description() -> None:
    root = crd.root_schema()
    missing = [
        path
        for part in ("spec", "status")
        for path, schema in walk(root["properties"][part], part)
        if not path.endswith(("[]", "{}")) and not schema.get("description")
    ]
    assert missing == []


def test_the_crd_is_a_valid_apiextensions_object() -> None:
    kubernetes_validate.validate(crd.build_crd(), "1.34", strict=True)


def test_kubectl_get_pj_shows_the_columns_users_expect() -> None:
    columns = crd.build_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    default = [c["name"].upper() for c in columns if not c.get("priority")]
    wide = [c["name"].upper() for c in columns if c.get("priority") == 1]
    assert default == ["LAYOUT", "GPUS", "NODES", "PHASE", "STEP", "LOSS", "RESTARTS", "AGE"]
    assert wide == [
        "TOKENS/S",
        "VAL-LOSS",
        "CHECKPOINT",
        "IN-PLACE",
        "TFLOP/S",
        "MFU",
        "STEP-S",
        "MODELED-S",
        "VS-MODEL",
        "STRAGGLERS",
        "MESSAGE",
    ]


def test_the_resource_is_namespaced_with_a_status_subresource_and_short_name() -> None:
    spec = crd.build_crd()["spec"]
    assert spec["scope"] == "Namespaced" and spec["names"]["shortNames"] == ["pj"]
    assert spec["versions"][0]["subresources"] == {"status": {}}


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_every_example_passes_the_structural_schema(example: pathlib.Path) -> None:
    schema = strip_kubernetes_extensions(crd.root_schema())
    jobs = [doc for doc in yaml.safe_load_all(example.read_text()) if doc and doc.get("kind") == "ParallelJob"]
    assert jobs
    for doc in jobs:
        jsonschema.validate(doc, schema)


def test_the_schema_rejects_unknown_fields_outside_preserved_objects() -> None:
    schema = crd.spec_schema()
    unknown_allowed = [path for path, s in walk(schema, "spec") if s.get("x-kubernetes-preserve-unknown-fields")]
    # Inside Kubernetes' own objects (a volume, an env var) the sources declared for CEL are preserved as well.
    kubernetes_objects = ("spec.checkpoint.volume.", "spec.template.volumes[].", "spec.template.env[].")
    unknown_allowed = [path for path in unknown_allowed if not path.startswith(kubernetes_objects)]
    assert sorted(unknown_allowed) == sorted(
        [
            "spec.deepspeed",
            "spec.deepspeed.zero_optimization",
            "spec.deepspeed.zero_optimization.offload_optimizer",
            "spec.deepspeed.bf16",
            "spec.deepspeed.fp16",
            "spec.checkpoint.volume",
            "spec.template.resources",
            "spec.template.tolerations[]",
            "spec.template.env[]",
            "spec.template.volumes[]",
            "spec.template.volumeMounts[]",
        ]
    )


def test_the_committed_api_reference_is_generated_from_the_crd() -> None:
    from paralleljob.api import reference

    committed = (ROOT / reference.REFERENCE_FILE).read_text()
    assert committed == reference.render_reference(), "run `paralleljob docs > docs/api-reference.md`"
