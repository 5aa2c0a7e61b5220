"""The training dashboard the chart ships: it meets Grafana's dashboard JSON model (a schema written from Grafana's
documented classic model, tests/chart/grafana_dashboard.schema.json), which does reject a malformed panel; its
panels do not overlap and every per-job query follows the namespace and job variables; and the chart puts it in
a ConfigMap with the sidecar's label, which a value changes. That every query returns data from a real Prometheus
is tests/upstream/test_prometheus.py's business."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest

from tests.chart.helpers import CHART, NON_DEFAULT_VALUES, REPO, render

DASHBOARD = json.loads((CHART / "dashboards" / "paralleljob-training.json").read_text())
SCHEMA = json.loads((REPO / "tests" / "chart" / "grafana_dashboard.schema.json").read_text())


def validate(dashboard: dict[str, Any]) -> None:
    jsonschema.Draft202012Validator(SCHEMA).validate(dashboard)


def test_the_dashboard_meets_grafanas_dashboard_model() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    validate(DASHBOARD)
    assert len({panel["id"] for panel in DASHBOARD["panels"]}) == len(DASHBOARD["panels"])


def _drop_width(d: dict[str, Any]) -> None:
    del d["panels"][0]["gridPos"]["w"]


def _too_wide(d: dict[str, Any]) -> None:
    d["panels"][1]["gridPos"]["w"] = 25


def _no_ref_id(d: dict[str, Any]) -> None:
    del d["panels"][2]["targets"][0]["refId"]


def _unknown_type(d: dict[str, Any]) -> None:
    d["panels"][0]["type"] = "timeseriess"


def _query_as_number(d: dict[str, Any]) -> None:
    d["panels"][3]["targets"][0]["expr"] = 42


def _typo_in_panel(d: dict[str, Any]) -> None:
    d["panels"][0]["gridpos"] = d["panels"][0].pop("gridPos")


@pytest.mark.parametrize(
    "break_it", [_drop_width, _too_wide, _no_ref_id, _unknown_type, _query_as_number, _typo_in_panel]
)
def test_a_malformed_panel_fails_the_check(break_it: Any) -> None:
    broken = copy.deepcopy(DASHBOARD)
    break_it(broken)
    with pytest.raises(jsonschema.ValidationError):
        validate(broken)


def test_panels_do_not_overlap_on_the_24_column_grid() -> None:
    cells: set[tuple[int, int]] = set()
    for panel in DASHBOARD["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        mine = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine


def test_the_variables_are_datasource_namespace_and_job_and_per_job_queries_follow_them() -> None:
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "$namespace" in variables["job"]["query"]["query"]
    for panel in DASHBOARD["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            if "paralleljob_job_" in target["expr"]:
                assert 'namespace=~"$namespace"' in target["expr"], (panel["title"], target["expr"])


def test_the_chart_ships_it_with_the_sidecars_label_which_a_value_changes() -> None:
    default = next(o for o in render() if o["kind"] == "ConfigMap")
    assert default["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(default["data"]["paralleljob-training.json"]) == DASHBOARD
    custom = next(o for o in render(NON_DEFAULT_VALUES) if o["kind"] == "ConfigMap")
    assert custom["metadata"]["labels"]["example.com/dashboard"] == "training"
    assert custom["metadata"]["namespace"] == "monitoring"
    assert not [o for o in render({"grafanaDashboard": {"enabled": False}}) if o["kind"] == "ConfigMap"]
