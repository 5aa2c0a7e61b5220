"""values.yaml and values.schema.json: every value documented in prose, and unknown keys rejected everywhere."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
import yaml

from tests.chart.helpers import CHART, NON_DEFAULT_VALUES, RenderError, render

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][A-Za-z0-9]*):")


def undocumented_keys(text: str) -> list[str]:
    """Keys of a values.yaml that no comment describes.

    A key is described by a comment right above it, or by a comment above one of its parents (a block of settings
    such as `resources` is described once); a mapping with no comment of its own is described when each of its
    children is.
    """
    commented: dict[tuple[str, ...], bool] = {}
    path: list[str] = []
    lines = text.splitlines()
    for number, line in enumerate(lines):
        match = KEY_LINE.match(line)
        if match:
            path = [*path[: len(match["indent"]) // 2], match["key"]]
            commented[tuple(path)] = number > 0 and lines[number - 1].lstrip().startswith("#")

    def described(key: tuple[str, ...]) -> bool:
        if any(commented[key[:i]] for i in range(1, len(key) + 1)):
            return True
        children = [k for k in commented if len(k) == len(key) + 1 and k[: len(key)] == key]
        return bool(children) and all(described(child) for child in children)

    return [".".join(key) for key in commented if not described(key)]


def test_every_value_is_documented_by_a_comment() -> None:
    assert undocumented_keys((CHART / "values.yaml").read_text()) == []


def test_the_documentation_check_notices_an_undocumented_value() -> None:
    text = "# documented\na: 1\nb: 2\nc:\n  # documented\n  d: 1\n  e: 2\n"
    assert undocumented_keys(text) == ["b", "c", "c.e"]


def schema_objects(node: Any, path: str = "$") -> list[tuple[str, dict[str, Any]]]:
    """Every object schema in the values schema, with its path."""
    found = []
    if isinstance(node, dict):
        if node.get("type") == "object":
            found.append((path, node))
        for key, child in node.items():
            found.extend(schema_objects(child, f"{path}.{key}"))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            found.extend(schema_objects(child, f"{path}[{index}]"))
    return found


def test_every_object_in_the_schema_closes_its_keys() -> None:
    """An object either lists its keys (additionalProperties: false) or is a map with typed values.

    The exceptions are `global` (Helm's, shared with parent charts) and the affinity terms, which are passed to
    the pod spec as they are and validated there by the Kubernetes schema (test_render.py).
    """
    open_objects = [
        path
        for path, node in schema_objects(SCHEMA)
        if "additionalProperties" not in node and not path.endswith((".global", "Affinity"))
    ]
    assert open_objects == []


def test_the_default_values_satisfy_the_schema() -> None:
    jsonschema.validate(VALUES, SCHEMA)


def test_the_non_default_values_satisfy_the_schema() -> None:
    jsonschema.validate(NON_DEFAULT_VALUES, SCHEMA)


# Kubernetes objects the chart passes through: the schema lists their optional fields, values.yaml sets a few.
PASS_THROUGH = {"global", "podSecurityContext", "containerSecurityContext", "resources", "affinity", "tolerations"}


def test_every_chart_setting_in_the_schema_has_a_default_in_values_yaml() -> None:
    """The schema and values.yaml describe the same keys, so the schema documents no setting that does nothing."""

    def keys(schema: dict[str, Any], values: dict[str, Any], prefix: str = "") -> set[str]:
        out = set()
        for key, sub in schema.get("properties", {}).items():
            if key in PASS_THROUGH:
                continue
            out.add(prefix + key)
            if sub.get("type") == "object" and "properties" in sub and isinstance(values.get(key), dict):
                out |= keys(sub, values[key], f"{prefix}{key}.")
        return out

    def value_keys(values: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> set[str]:
        out = set()
        for key, value in values.items():
            out.add(prefix + key)
            sub = schema.get("properties", {}).get(key, {})
            if isinstance(value, dict) and "properties" in sub:
                out |= value_keys(value, sub, f"{prefix}{key}.")
        return out

    assert keys(SCHEMA, VALUES) - value_keys(VALUES, SCHEMA) == set()


def test_docs_install_md_lists_every_value() -> None:
    """The values table of docs/install.md names every value (a block like `operator.livenessProbe.*` at once)."""
    docs = (CHART.parents[1] / "docs" / "install.md").read_text()

    def leaves(values: dict[str, Any], prefix: str = "") -> list[str]:
        """Settings: scalars, lists, maps of the user's own keys, and the Kubernetes objects passed through."""
        out = []
        for key, value in values.items():
            path = prefix + key
            nested = isinstance(value, dict) and value and key not in PASS_THROUGH
            out += leaves(value, path + ".") if nested else [path]
        return out

    def listed(path: str) -> bool:
        parents = [path.rsplit(".", i)[0] for i in range(1, path.count(".") + 1)]
        return f"`{path}`" in docs or any(f"`{parent}.*`" in docs for parent in parents)

    assert [p for p in leaves(VALUES) if not listed(p)] == []


@pytest.mark.parametrize(
    "values",
    [
        {"replicaCount": 2},
        {"image": {"repository": "x", "tags": "typo"}},
        {"operator": {"loglevel": "debug"}},
        {"jobDefaults": {"trainerImage": {"repository": "x", "pullPolicy": "Always"}}},
        {"metrics": {"serviceMonitor": {"enabled": True, "namespace": "monitoring"}}},
        {"containerSecurityContext": {"readOnlyRootFileSystem": True}},
        {"podSecurityContext": {"seccompProfile": {"type": "RuntimeDefault", "profile": "x"}}},
        {"crds": {"enabled": True, "keep": True, "install": True}},
    ],
    ids=[
        "top-level",
        "image",
        "operator",
        "trainer-image",
        "service-monitor",
        "container-security-context",
        "seccomp-profile",
        "crds",
    ],
)
def test_helm_rejects_an_unknown_key(values: dict[str, Any]) -> None:
    with pytest.raises(RenderError, match="additional properties"):
        render(values)


@pytest.mark.parametrize(
    "values",
    [
        {"jobDefaults": {"fabric": "ethernet"}},
        {"operator": {"logLevel": "verbose"}},
        {"watchNamespaces": ["Not_A_Namespace"]},
        {"jobDefaults": {"ncclEnv": {"NCCL_IB_TIMEOUT": 22}}},
        {"image": {"repository": "x", "digest": "latest"}},
    ],
    ids=["fabric", "log-level", "namespace-name", "nccl-env-not-a-string", "digest"],
)
def test_helm_rejects_an_invalid_value(values: dict[str, Any]) -> None:
    with pytest.raises(RenderError):
        render(values)
