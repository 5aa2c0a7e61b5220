"""The chart's identity: its versions follow the package, and `helm lint --strict` accepts it."""

from __future__ import annotations

import tomllib

import pytest
import yaml

from tests.chart.helpers import CHART, NON_DEFAULT_VALUES, REPO, run_helm


def package_version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_chart_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == package_version(), "set appVersion in Chart.yaml to pyproject.toml's version"


def test_chart_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == package_version(), "set version in Chart.yaml to pyproject.toml's version"


@pytest.mark.parametrize("values", [{}, NON_DEFAULT_VALUES], ids=["default-values", "non-default-values"])
def test_helm_lint_strict_passes(values: dict, tmp_path) -> None:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    completed = run_helm("lint", "--strict", str(CHART), "--values", str(values_file), check=False)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "0 chart(s) failed" in completed.stdout


def test_helm_package_builds_an_archive(tmp_path) -> None:
    run_helm("package", str(CHART), "--destination", str(tmp_path))
    assert (tmp_path / f"paralleljob-operator-{package_version()}.tgz").is_file()
