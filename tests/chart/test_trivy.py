"""An outside scanner's view of what we ship: Trivy's Kubernetes and Dockerfile misconfiguration checks (the ones
embedded in the pinned binary, scripts/build-trivy.sh; nothing is downloaded) on the chart rendered with its
defaults and with the ValidatingAdmissionPolicy on, and on the images' recipes. Every finding must be justified in
the reviewed ignore file, .trivyignore.yaml, and every entry there must still match a finding, so a new finding, a
fixed one and an entry without its reason all fail. docs/install.md, "Outside scan", lists the findings and why.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from testcluster.chart import tool_path
from tests.chart.helpers import REPO, render

# The tests share the scanned tree and the reviewed scan (module fixtures): on one worker, each is made once.
pytestmark = pytest.mark.xdist_group("trivy")

IGNORE_FILE = REPO / ".trivyignore.yaml"
# The chart as a user installs it, and with the switch that adds objects (the admission policy and its binding).
RENDERS = {"default": {}, "admission-policy": {"policy": {"validatingAdmissionPolicy": {"enabled": True}}}}
RECIPES = [
    Path("Dockerfile"),
    Path("trainer-image/Dockerfile"),
    *(path.relative_to(REPO) for path in sorted((REPO / "images").glob("*.Containerfile"))),
]
# Checks only, with the rules compiled into the binary: no checks bundle, no vulnerability database, no version
# check or telemetry, so the scan makes no network access and gives the same answer on every machine.
OFFLINE = [
    "--scanners",
    "misconfig",
    "--misconfig-scanners",
    "kubernetes,dockerfile",
    "--skip-check-update",
    "--skip-db-update",
    "--offline-scan",
    "--skip-version-check",
    "--disable-telemetry",
    "--format",
    "json",
    "--quiet",
]


def trivy() -> str:
    """The pinned Trivy from .tools/bin (else $PATH); fails the test (never skips) when absent, as helm does."""
    found = tool_path("trivy")
    if found is None:
        pytest.fail(
            "trivy not found in .tools/bin or on PATH: run scripts/build-trivy.sh (`make tools`)", pytrace=False
        )
    return found


def write_scan_tree(root: Path) -> None:
    """One file per rendered object (chart/<render>/<Kind>-<name>.yaml), so that an ignore entry's `paths` names the
    one object it excuses; the recipes at their repository paths."""
    for render_name, values in RENDERS.items():
        folder = root / "chart" / render_name
        folder.mkdir(parents=True)
        for obj in render(values):
            (folder / f"{obj['kind']}-{obj['metadata']['name']}.yaml").write_text(yaml.safe_dump(obj))
    for recipe in RECIPES:
        (root / recipe).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / recipe, root / recipe)


def scan(root: Path, *options: str) -> list[dict[str, Any]]:
    """Trivy's results, one per scanned file with a finding."""
    completed = subprocess.run(
        [trivy(), "fs", *OFFLINE, "--cache-dir", str(root.parent / "cache"), *options, str(root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout).get("Results") or []


def failures(results: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(check ID, file) of every failed check Trivy reports."""
    return {
        (found["ID"], result["Target"])
        for result in results
        for found in result.get("Misconfigurations") or []
        if found["Status"] == "FAIL"
    }


def suppressed(results: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """(check ID, file) of every failed check the ignore file hid, with the statement of the entry that hid it."""
    return {
        (modified["Finding"]["ID"], result["Target"]): modified["Statement"]
        for result in results
        for modified in result.get("ExperimentalModifiedFindings") or []
        if modified["Type"] == "misconfiguration" and modified["Finding"]["Status"] == "FAIL"
    }


def describe(results: list[dict[str, Any]]) -> str:
    """One line per failed check: ID, severity, file (for the chart, the object: <Kind>-<name>.yaml), message."""
    return "\n".join(
        f"{found['ID']} {found['Severity']} {result['Target']}: {found['Message']}"
        for result in results
        for found in result.get("Misconfigurations") or []
        if found["Status"] == "FAIL"
    )


def ignore_entries() -> list[dict[str, Any]]:
    return yaml.safe_load(IGNORE_FILE.read_text())["misconfigurations"]


@pytest.fixture(scope="module")
def scan_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trivy") / "scanned"
    write_scan_tree(root)
    return root


@pytest.fixture(scope="module")
def reviewed_scan(scan_tree: Path) -> list[dict[str, Any]]:
    return scan(scan_tree, "--ignorefile", str(IGNORE_FILE), "--show-suppressed")


def test_every_finding_is_justified_in_the_ignore_file(reviewed_scan: list[dict[str, Any]]) -> None:
    unjustified = describe(reviewed_scan)
    assert not unjustified, f"Trivy findings not justified in {IGNORE_FILE.name}:\n{unjustified}"


def test_every_ignore_entry_still_excuses_a_finding(reviewed_scan: list[dict[str, Any]]) -> None:
    hidden = suppressed(reviewed_scan)
    stale = [
        f"{entry['id']} {path}"
        for entry in ignore_entries()
        for path in entry["paths"]
        if not any(check == entry["id"] and Path(target).match(path) for check, target in hidden)
    ]
    assert not stale, f"entries of {IGNORE_FILE.name} that no finding needs any more: {stale}"


def test_the_scan_without_the_ignore_file_finds_exactly_what_the_file_excuses(
    scan_tree: Path, reviewed_scan: list[dict[str, Any]]
) -> None:
    # The teeth: the checks run and fail on these objects; only the reviewed entries keep them out of the answer.
    found = failures(scan(scan_tree))
    assert found, "Trivy found nothing at all: are its embedded checks loaded?"
    assert found == set(suppressed(reviewed_scan))


def test_every_ignore_entry_names_its_objects_and_says_why_in_one_line() -> None:
    for entry in ignore_entries():
        assert entry.get("paths"), f"{entry['id']}: name the files (objects) it excuses, not every file"
        statement = entry.get("statement", "").strip()
        assert statement and "\n" not in statement, f"{entry['id']} {entry['paths']}: one line saying why"
