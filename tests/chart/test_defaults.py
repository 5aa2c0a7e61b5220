"""The operator's defaults are written once (`paralleljob.defaults`): the flags of `paralleljob operator`, the
reconcile pass's `Settings` and the chart's values.yaml all state the same ones."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from paralleljob import cli, defaults
from paralleljob.handlers.passes import Settings

CHART = Path(__file__).resolve().parents[2] / "charts" / "paralleljob-operator"
# Each default: its flag's attribute, its Settings field (None: not a setting of the pass), its values.yaml path.
WHERE = {
    "FABRIC": ("default_fabric", "default_fabric", "jobDefaults.fabric"),
    "START_TIMEOUT_SECONDS": ("start_timeout", "start_timeout_seconds", "recovery.startTimeoutSeconds"),
    "CONTAINER_CREATING_TIMEOUT_SECONDS": (
        "container_creating_timeout", "container_creating_timeout_seconds", "recovery.containerCreatingTimeoutSeconds"
    ),
    "IMAGE_PULL_RETRIES": ("image_pull_retries", "image_pull_retries", "recovery.imagePullRetries"),
    "FORCE_DELETE_AFTER_SECONDS": ("force_delete_after", "force_delete_after_seconds", "recovery.forceDeleteAfterSeconds"),
    "RESTART_HOLD_SECONDS": ("restart_hold", "restart_hold_seconds", "recovery.restartHoldSeconds"),
    "RESYNC_SECONDS": ("resync_period", "resync_seconds", "recovery.resyncPeriodSeconds"),
    "NOT_READY_GRACE_SECONDS": ("not_ready_grace", "not_ready_grace_seconds", "recovery.notReadyGraceSeconds"),
    "LOST_NODE_LEASE_SECONDS": ("lost_node_lease", "lost_node_lease_seconds", "recovery.lostNodeLeaseSeconds"),
    "KUEUE_CHECKPOINT_GRACE_SECONDS": (
        "kueue_checkpoint_grace", "kueue_checkpoint_grace_seconds", "kueue.checkpointGraceSeconds"
    ),
    "METRICS_PORT": ("metrics_port", None, "metrics.port"),
    "LEASE_SECONDS": ("lease_seconds", None, "leaderElection.leaseSeconds"),
}  # fmt: skip


def value_at(values: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        values = values[key]
    return values


def test_every_default_is_placed() -> None:
    written = {name for name in vars(defaults) if name.isupper()}
    assert written - set(WHERE) == {"TRAINER_IMAGE", "ADMISSION_LOCK"}


def test_the_flags_default_to_the_written_defaults() -> None:
    flags = cli.build_parser().parse_args(["operator"])
    assert {name: getattr(flags, where[0]) for name, where in WHERE.items()} == {
        name: getattr(defaults, name) for name in WHERE
    }
    assert (flags.trainer_image, flags.admission_lock) == (defaults.TRAINER_IMAGE, defaults.ADMISSION_LOCK)


def test_the_pass_settings_default_to_the_written_defaults() -> None:
    settings = Settings()
    fields = {name: where[1] for name, where in WHERE.items() if where[1]}
    assert {name: getattr(settings, field) for name, field in fields.items()} == {
        name: getattr(defaults, name) for name in fields
    }
    assert settings.image == defaults.TRAINER_IMAGE
    assert {f.name for f in dataclasses.fields(Settings) if f.default is not dataclasses.MISSING} >= set(
        fields.values()
    )


def test_the_charts_values_state_the_written_defaults() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert {name: value_at(values, where[2]) for name, where in WHERE.items()} == {
        name: getattr(defaults, name) for name in WHERE
    }
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = values["jobDefaults"]["trainerImage"]
    assert f"{image['repository']}:{image['tag'] or chart['appVersion']}" == defaults.TRAINER_IMAGE
    lock = values["admissionLock"]
    assert f"{lock['namespace']}/{lock['name']}" == defaults.ADMISSION_LOCK
