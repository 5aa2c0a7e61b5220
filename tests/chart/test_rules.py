"""The chart's alert rules, checked by Prometheus' own tools: `promtool check rules` parses the rendered
PrometheusRule, and `promtool test rules` runs each alert on series shaped like the operator's (it fires on the
bad case, stays quiet on the good one). Each alert has its runbook entry in docs/install.md. That the expressions
return data from the operator on a cluster is tests/upstream/test_prometheus.py's business.

promtool comes from Debian's prometheus package (scripts/install-prometheus.sh, part of `make tools`); a missing
promtool fails these tests with that command, never skips them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.helpers import CHART, render

ALERTS = (
    "ParallelJobStalled",
    "ParallelJobRestartingOften",
    "ParallelJobSlowerThanModeled",
    "ParallelJobCheckpointStale",
    "ParallelJobRivalOperators",
    "ParallelJobOperatorNotLeading",
)
JOB = 'namespace="default", name="gpt"'


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found: run scripts/install-prometheus.sh", pytrace=False)
    return found


def rules_file(folder: Path, values: dict[str, Any] | None = None) -> Path:
    """The rendered PrometheusRule's groups as a Prometheus rules file (the same format)."""
    rule = next(
        o for o in render({"prometheusRule": {"enabled": True, **(values or {})}}) if o["kind"] == "PrometheusRule"
    )
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def test_the_rules_parse_and_every_alert_has_a_runbook_entry(tmp_path: Path) -> None:
    path = rules_file(tmp_path)
    checked = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rules = yaml.safe_load(path.read_text())["groups"][0]["rules"]
    assert tuple(rule["alert"] for rule in rules) == ALERTS
    docs = (CHART.parents[1] / "docs" / "install.md").read_text()
    for rule in rules:
        anchor = rule["annotations"]["runbook"].split("#")[1]
        assert f"#### {rule['alert']}" in docs and anchor == rule["alert"].lower()


def series(values: dict[str, str]) -> list[dict[str, str]]:
    return [{"series": name, "values": shape} for name, shape in values.items()]


# Each case: input series (1m apart), the alert, when it is evaluated, the alerts expected then.
CASES = {
    "stalled-past-its-timeout": (
        {
            f"paralleljob_job_seconds_since_step{{{JOB}}}": "10 40 70 100",
            f"paralleljob_job_progress_timeout_seconds{{{JOB}}}": "60x3",
            f'paralleljob_job_phase{{{JOB}, phase="Running"}}': "1x3",
        },
        "ParallelJobStalled",
        "3m",
        [{"exp_labels": {"namespace": "default", "name": "gpt", "severity": "warning"}}],
    ),
    "stepping-within-its-timeout": (
        {
            f"paralleljob_job_seconds_since_step{{{JOB}}}": "10 5 20 5",
            f"paralleljob_job_progress_timeout_seconds{{{JOB}}}": "60x3",
            f'paralleljob_job_phase{{{JOB}, phase="Running"}}': "1x3",
        },
        "ParallelJobStalled",
        "3m",
        [],
    ),
    "restarting-often": (
        {
            f'paralleljob_job_restarts_total{{{JOB}, kind="gang"}}': "0 1 2 3 4",
            f'paralleljob_job_restarts_total{{{JOB}, kind="in_place"}}': "0 0 1 1 2",
        },
        "ParallelJobRestartingOften",
        "4m",
        [{"exp_labels": {"namespace": "default", "name": "gpt", "severity": "warning"}}],
    ),
    "slower-than-modeled": (
        {
            f"paralleljob_job_step_seconds{{{JOB}}}": "2x20",
            f"paralleljob_job_modeled_step_seconds{{{JOB}}}": "1x20",
        },
        "ParallelJobSlowerThanModeled",
        "20m",
        [{"exp_labels": {"namespace": "default", "name": "gpt", "severity": "warning"}, "value": "2"}],
    ),
    "as-fast-as-modeled": (
        {
            f"paralleljob_job_step_seconds{{{JOB}}}": "1.2x20",
            f"paralleljob_job_modeled_step_seconds{{{JOB}}}": "1x20",
        },
        "ParallelJobSlowerThanModeled",
        "20m",
        [],
    ),
    "checkpoint-stale-while-running": (
        {
            f"paralleljob_job_checkpoint_age_seconds{{{JOB}}}": "7000+60x10",
            f'paralleljob_job_phase{{{JOB}, phase="Running"}}': "1x10",
        },
        "ParallelJobCheckpointStale",
        "10m",
        [
            {
                "exp_labels": {"namespace": "default", "name": "gpt", "severity": "warning"},
                "value": "2h 6m 40s",
            }
        ],
    ),
    "rival-operators": (
        {"paralleljob_rival_operators": "1x10"},
        "ParallelJobRivalOperators",
        "10m",
        [{"exp_labels": {"severity": "warning"}}],
    ),
    "not-leading": (
        {"paralleljob_leader": "0x10"},
        "ParallelJobOperatorNotLeading",
        "10m",
        [{"exp_labels": {"severity": "warning"}}],
    ),
    "leading": ({"paralleljob_leader": "1x10"}, "ParallelJobOperatorNotLeading", "10m", []),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_alert_fires_on_its_case_and_only_then(case: str, tmp_path: Path) -> None:
    inputs, alert, at, expected = CASES[case]
    rules = rules_file(tmp_path)
    for item in expected:
        item["exp_annotations"] = _annotations(rules, alert, item["exp_labels"], item.pop("value", ""))
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series(inputs),
                "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": expected}],
            }
        ],
    }
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(test))
    ran = subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr


def _annotations(rules: Path, alert: str, labels: dict[str, str], value: str) -> dict[str, str]:
    """The alert's annotations with its labels and the case's humanized value filled in, as Prometheus renders them."""
    rule = next(r for r in yaml.safe_load(rules.read_text())["groups"][0]["rules"] if r["alert"] == alert)
    out = {}
    for key, text in rule["annotations"].items():
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m[1], ""), text)
        text = re.sub(r"\{\{ \$value \| humanize(Duration)? \}\}", value, text)
        out[key] = text
    return out
