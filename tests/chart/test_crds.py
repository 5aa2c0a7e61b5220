"""The chart's CRD is the repository's CRD, behind crds.enabled and kept on uninstall by default; the check
fails when the two drift. (That crds/ is what `paralleljob crd` prints is tests/api/test_crd.py's business.)"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import yaml

from tests.chart.helpers import REPO, render

SOURCE = REPO / "crds" / "paralleljob.io_paralleljobs.yaml"
SYNC_SCRIPT = REPO / "scripts" / "sync_chart_crds.py"


def rendered_crd(values: dict | None = None) -> dict:
    crds = [o for o in render(values) if o["kind"] == "CustomResourceDefinition"]
    assert len(crds) == 1
    return crds[0]


def run_sync(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SYNC_SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_the_chart_copy_is_in_sync_with_crds() -> None:
    completed = run_sync("--check")
    assert completed.returncode == 0, completed.stderr


def test_the_sync_check_fails_when_the_source_changes(tmp_path: pathlib.Path) -> None:
    changed = tmp_path / "crd.yaml"
    crd = yaml.safe_load(SOURCE.read_text())
    crd["spec"]["names"]["shortNames"].append("pjob")
    changed.write_text(yaml.safe_dump(crd, sort_keys=False))
    completed = run_sync("--check", "--source", str(changed))
    assert completed.returncode == 1
    assert "out of date" in completed.stderr


def test_the_rendered_crd_is_the_generated_crd() -> None:
    source = yaml.safe_load(SOURCE.read_text())
    rendered = rendered_crd()
    assert rendered["spec"] == source["spec"]
    assert rendered["metadata"]["name"] == source["metadata"]["name"]


def test_the_crd_is_kept_on_uninstall_by_default() -> None:
    assert rendered_crd()["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}


def test_the_crd_is_not_kept_when_keep_is_off() -> None:
    assert "annotations" not in rendered_crd({"crds": {"enabled": True, "keep": False}})["metadata"]


def test_no_crd_is_rendered_when_crds_are_disabled() -> None:
    assert [
        o for o in render({"crds": {"enabled": False, "keep": True}}) if o["kind"] == "CustomResourceDefinition"
    ] == []


def test_the_chart_has_no_crds_folder_that_helm_would_install_unconditionally() -> None:
    assert not (REPO / "charts" / "paralleljob-operator" / "crds").exists()
