"""The in-pod progress hook: rank 0 writes training progress into its ParallelJob's status.

Loaded by the trainer from `PARALLELJOB_PROGRESS_HOOK=paralleljob_trainer.k8s_status:create_hook`, which
the operator sets on rank 0's pod. It PATCHes `status.progress` and `status.lastCheckpointStep` of the
job through the `status` subresource (JSON merge patch), authenticated as the pod's ServiceAccount (the
operator's per-job `<job>-progress` account may only get/patch this one job's status).

Standard library only (urllib): the trainer image does not ship the kubernetes client. Step reports are
rate-limited (at most one PATCH per `PARALLELJOB_STATUS_INTERVAL` seconds, default 10; the latest record
wins and the final one is flushed at the end); checkpoints are reported at once. Requests are sent by a
background thread, so a slow or unreachable API server never holds up a training step: the hook only
merges the report into one pending patch (bounded: the latest value of each field wins) and wakes the
sender. `on_finish` flushes and waits for the sender a bounded time. No API error ever reaches training:
failures are reported on stderr (once per kind) and the next report tries again.
"""

from __future__ import annotations

import datetime
import json
import os
import ssl
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from paralleljob_contract import environment
from paralleljob_contract.environment import PodEnvironment

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
GROUP, VERSION, PLURAL = "paralleljob.io", "v1alpha1", "paralleljobs"
DEFAULT_INTERVAL_SECONDS = environment.DEFAULT_STATUS_INTERVAL_SECONDS
REQUEST_TIMEOUT_SECONDS = 5.0
# How long on_finish waits for the last report to go out: the request timeout and a margin.
FINISH_WAIT_SECONDS = 2 * REQUEST_TIMEOUT_SECONDS


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StatusReporter:
    """A ProgressHook that patches the job's status subresource, rate-limited and never raising."""

    def __init__(
        self,
        api_url: str,
        namespace: str,
        name: str,
        *,
        token_path: Path | None = SERVICE_ACCOUNT / "token",
        ca_path: Path | None = SERVICE_ACCOUNT / "ca.crt",
        interval: float = DEFAULT_INTERVAL_SECONDS,
        total_steps: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = f"{api_url.rstrip('/')}/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"
        self.token_path, self.interval, self.total_steps, self.clock = token_path, interval, total_steps, clock
        self.context = ssl.create_default_context(cafile=str(ca_path)) if ca_path and ca_path.exists() else None
        self.last_sent: float | None = None
        self.pending: dict[str, Any] | None = None
        self.reported_errors: set[str] = set()
        self.patches = 0
        self._outbox: dict[str, Any] = {}
        self._sending = False
        self._changed = threading.Condition()
        self._sender = threading.Thread(target=self._send_forever, name="paralleljob-status", daemon=True)
        self._sender.start()

    # -- the ProgressHook protocol -----------------------------------------------------------------------

    def on_step(self, record: Mapping[str, Any]) -> None:
        self.pending = self.progress_of(record)
        if isinstance(record.get("network"), Mapping):
            # Once per attempt, not rate-limited: the operator turns it into the NetworkVerified condition.
            self._submit({"network": network_of(record["network"]), "progress": self.pending})
            self.pending = None
            return
        now = self.clock()
        if self.last_sent is None or now - self.last_sent >= self.interval:
            self.flush()

    def on_checkpoint(self, record: Mapping[str, Any]) -> None:
        patch: dict[str, Any] = {"lastCheckpointStep": int(record.get("step", 0))}
        if self.pending is not None:
            patch["progress"] = self.pending
            self.pending = None
        self._submit(patch)

    def on_finish(self, record: Mapping[str, Any]) -> None:
        self.flush()
        self.wait_sent(FINISH_WAIT_SECONDS)

    # -- internals ---------------------------------------------------------------------------------------

    def progress_of(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """status.progress from a metrics.jsonl step record."""
        progress: dict[str, Any] = {"step": int(record.get("step", 0)), "updated": _now()}
        if self.total_steps is not None:
            progress["totalSteps"] = self.total_steps
        # Rounded for people: `kubectl get pj` prints these numbers as they are stored.
        if record.get("loss") is not None:
            progress["loss"] = round(float(record["loss"]), 4)
        if record.get("tokens_per_s") is not None:
            progress["tokensPerSecond"] = round(float(record["tokens_per_s"]), 1)
        return progress

    def flush(self) -> None:
        if self.pending is not None:
            progress, self.pending = self.pending, None
            self._submit({"progress": progress})

    def wait_sent(self, timeout: float) -> bool:
        """Wait until every submitted report has been sent (or has failed); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._outbox or self._sending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def _submit(self, status: Mapping[str, Any]) -> None:
        """Merge into the one pending patch (latest value per field wins) and wake the sender."""
        self.last_sent = self.clock()
        with self._changed:
            self._outbox.update(status)
            self._changed.notify_all()

    def _send_forever(self) -> None:
        while True:
            with self._changed:
                while not self._outbox:
                    self._changed.wait()
                status, self._outbox, self._sending = self._outbox, {}, True
            try:
                self._send(status)
            except Exception as error:
                self._report(type(error).__name__, str(error))
            finally:
                with self._changed:
                    self._sending = False
                    self._changed.notify_all()

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/merge-patch+json", "Accept": "application/json"}
        if self.token_path is not None and self.token_path.exists():
            # Re-read every time: projected ServiceAccount tokens are rotated by the kubelet.
            headers["Authorization"] = f"Bearer {self.token_path.read_text().strip()}"
        return headers

    def _send(self, status: Mapping[str, Any]) -> bool:
        body = json.dumps({"status": dict(status)}).encode()
        request = urllib.request.Request(self.url, data=body, method="PATCH", headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_SECONDS, context=self.context):
                self.patches += 1
                return True
        except urllib.error.HTTPError as error:
            self._report(f"HTTP {error.code}", f"{error.code} {error.reason}")
        except (urllib.error.URLError, OSError, ValueError) as error:
            self._report(type(error).__name__, str(error))
        return False

    def _report(self, kind: str, detail: str) -> None:
        if kind not in self.reported_errors:
            self.reported_errors.add(kind)
            print(f"paralleljob-trainer: status report failed ({detail}); training goes on", file=sys.stderr)


def network_of(verdict: Mapping[str, Any]) -> dict[str, str]:
    """status.network from the trainer's network verdict (paralleljob_trainer.nccl_log.Verdict.to_record)."""
    return {key: str(verdict[key]) for key in ("verified", "reason", "message") if verdict.get(key) is not None}


def _total_steps(config_path: str | None) -> int | None:
    try:
        return int(json.loads(Path(config_path or "").read_text())["spec"]["training"]["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def create_hook() -> StatusReporter:
    """The factory named in PARALLELJOB_PROGRESS_HOOK; configured from the pod's environment.

    PARALLELJOB_STATUS_API overrides the API URL (default: https://$KUBERNETES_SERVICE_HOST:$..._PORT).
    """
    environ = os.environ
    env = PodEnvironment.from_environ(environ, required=(environment.NAMESPACE, environment.JOB_NAME))
    host = environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    host = f"[{host}]" if ":" in host else host
    return StatusReporter(
        env.status_api or f"https://{host}:{port}",
        str(env.namespace),
        str(env.job_name),
        interval=env.status_interval_seconds,
        total_steps=_total_steps(env.config_path),
    )
