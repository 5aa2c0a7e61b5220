"""The in-pod progress hook: rank 0 writes training progress into its job's progress ConfigMap.

Loaded by the trainer from `PARALLELJOB_PROGRESS_HOOK=paralleljob_trainer.k8s_status:create_hook`, which
the operator sets on rank 0's pod. It PATCHes the `data` of the ConfigMap `<job>-progress` (JSON merge patch:
step, loss, tokensPerSecond, updated, lastCheckpointStep, as strings), authenticated as the pod's
ServiceAccount: the operator's per-job `<job>-progress` account may patch that one ConfigMap and nothing else.
The operator validates the numbers and copies them into the job's `status.progress`; it never acts on them.

Standard library only (urllib): the trainer image does not ship the kubernetes client. Step reports are
rate-limited (at most one PATCH per `PARALLELJOB_STATUS_INTERVAL` seconds, default 10; the latest record
wins and the final one is flushed at the end); checkpoints are reported at once. Requests are sent by a
background thread, so a slow or unreachable API server never holds up a training step: the hook only
merges the report into one pending patch (bounded: the latest value of each field wins) and wakes the
sender. `on_finish` flushes and waits for the sender a bounded time. No API error ever reaches training:
failures are reported on stderr (once per kind) and the next report tries again.

The answer to each PATCH is the ConfigMap itself: a checkpoint request the operator wrote there (an id under
`checkpointRequest`) is kept, handed once to the trainer (`checkpoint_request`), and answered with
`checkpointServed` in the report of the checkpoint taken for it.
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
from paralleljob_contract import progress as channel
from paralleljob_contract.environment import PodEnvironment

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_INTERVAL_SECONDS = environment.DEFAULT_STATUS_INTERVAL_SECONDS
REQUEST_TIMEOUT_SECONDS = 5.0
# How long on_finish waits for the last report to go out: the request timeout and a margin.
FINISH_WAIT_SECONDS = 2 * REQUEST_TIMEOUT_SECONDS


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ProgressReporter:
    """A ProgressHook that patches the job's progress ConfigMap, rate-limited and never raising."""

    def __init__(
        self,
        api_url: str,
        namespace: str,
        name: str,
        *,
        token_path: Path | None = SERVICE_ACCOUNT / "token",
        ca_path: Path | None = SERVICE_ACCOUNT / "ca.crt",
        interval: float = DEFAULT_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        config_map = channel.config_map_name(name)
        self.url = f"{api_url.rstrip('/')}/api/v1/namespaces/{namespace}/configmaps/{config_map}"
        self.token_path, self.interval, self.clock = token_path, interval, clock
        self.context = ssl.create_default_context(cafile=str(ca_path)) if ca_path and ca_path.exists() else None
        self.last_sent: float | None = None
        self.pending: dict[str, str] | None = None
        self.validation_loss: str | None = None  # the latest evaluation's, as sent
        self.reported_errors: set[str] = set()
        self.patches = 0
        self.request_seen: str | None = None  # the operator's latest checkpoint request, from a PATCH's answer
        self.request_taken: str | None = None  # the one handed to the trainer
        self._outbox: dict[str, str] = {}
        self._sending = False
        self._changed = threading.Condition()
        self._sender = threading.Thread(target=self._send_forever, name="paralleljob-status", daemon=True)
        self._sender.start()

    # -- the ProgressHook protocol -----------------------------------------------------------------------

    def on_step(self, record: Mapping[str, Any]) -> None:
        self.pending = self.progress_of(record)
        if isinstance(record.get("network"), Mapping):
            # Once per attempt, not rate-limited: the operator turns it into the NetworkVerified condition.
            self._submit({**network_of(record["network"]), **self.pending})
            self.pending = None
            return
        now = self.clock()
        if self.last_sent is None or now - self.last_sent >= self.interval:
            self.flush()

    def on_checkpoint(self, record: Mapping[str, Any]) -> None:
        patch = {channel.LAST_CHECKPOINT_STEP: str(int(record.get("step", 0))), channel.LAST_CHECKPOINT_TIME: _now()}
        if record.get("request"):
            patch[channel.CHECKPOINT_SERVED] = str(record["request"])
        if record.get("event") == "resume" and record.get("saved_layout") and record.get("layout"):
            patch[channel.RESUMED_FROM_LAYOUT] = str(record["saved_layout"])
            patch[channel.RESUMED_AT_LAYOUT] = str(record["layout"])
        if self.pending is not None:
            patch.update(self.pending)
            self.pending = None
        self._submit(patch)

    def on_finish(self, record: Mapping[str, Any]) -> None:
        self.flush()
        self.wait_sent(FINISH_WAIT_SECONDS)

    def on_lost_peers(self, text: str) -> None:
        """Node rank 0's supervisor: the peers its coordinator no longer hears from (`paralleljob_contract.peers`
        encoded), sent at once, not rate-limited: the operator replaces a lost node on it and the Node's Lease."""
        self._submit({channel.LOST_PEERS: text})

    def checkpoint_request(self) -> str | None:
        """The operator's checkpoint request not handed to the trainer yet (each id once), or None."""
        with self._changed:
            seen = self.request_seen
            if seen is None or seen == self.request_taken:
                return None
            self.request_taken = seen
            return seen

    # -- internals ---------------------------------------------------------------------------------------

    def progress_of(self, record: Mapping[str, Any]) -> dict[str, str]:
        """The ConfigMap data of a metrics.jsonl step record (ConfigMap values are strings)."""
        progress = {channel.STEP: str(int(record.get("step", 0))), channel.UPDATED: _now()}
        # Rounded for people: `kubectl get pj` prints these numbers as the operator copies them.
        if record.get("loss") is not None:
            progress[channel.LOSS] = repr(round(float(record["loss"]), 4))
        if record.get("tokens_per_s") is not None:
            progress[channel.TOKENS_PER_SECOND] = repr(round(float(record["tokens_per_s"]), 1))
        if record.get("in_place_restarts") is not None:
            progress[channel.IN_PLACE_RESTARTS] = str(int(record["in_place_restarts"]))
        if record.get("validation_loss") is not None:
            self.validation_loss = repr(round(float(record["validation_loss"]), 4))
        # Every report carries the latest validation loss: the operator nulls what a report lacks, and a
        # rate-limited evaluation step's report may be replaced by the next step's before it is sent.
        if self.validation_loss is not None:
            progress[channel.VALIDATION_LOSS] = self.validation_loss
        progress.update(efficiency_of(record))
        if isinstance(record.get("stragglers"), list):
            progress[channel.STRAGGLERS] = json.dumps(record["stragglers"], separators=(",", ":"))
        return progress

    def flush(self) -> None:
        if self.pending is not None:
            progress, self.pending = self.pending, None
            self._submit(progress)

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

    def _submit(self, data: Mapping[str, str]) -> None:
        """Merge into the one pending patch (latest value per field wins) and wake the sender."""
        self.last_sent = self.clock()
        with self._changed:
            self._outbox.update(data)
            self._changed.notify_all()

    def _send_forever(self) -> None:
        while True:
            with self._changed:
                while not self._outbox:
                    self._changed.wait()
                data, self._outbox, self._sending = self._outbox, {}, True
            try:
                self._send(data)
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

    def _send(self, data: Mapping[str, str]) -> bool:
        body = json.dumps({"data": dict(data)}).encode()
        request = urllib.request.Request(self.url, data=body, method="PATCH", headers=self._headers())
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_SECONDS, context=self.context) as answer:
                self.patches += 1
                self._note_request(answer.read())
                return True
        except urllib.error.HTTPError as error:
            self._report(f"HTTP {error.code}", f"{error.code} {error.reason}")
        except (urllib.error.URLError, OSError, ValueError) as error:
            self._report(type(error).__name__, str(error))
        return False

    def _note_request(self, answer: bytes) -> None:
        """Keep the checkpoint request the patched ConfigMap carries, if any."""
        try:
            data = json.loads(answer or b"{}").get("data") or {}
            found = data.get(channel.CHECKPOINT_REQUEST)
        except (ValueError, AttributeError):
            return
        if found and found != data.get(channel.CHECKPOINT_SERVED):  # one an earlier gang served is not new
            with self._changed:
                self.request_seen = str(found)

    def _report(self, kind: str, detail: str) -> None:
        if kind not in self.reported_errors:
            self.reported_errors.add(kind)
            print(f"paralleljob-trainer: status report failed ({detail}); training goes on", file=sys.stderr)


# A step record's efficiency fields and the channel's keys for them, with the significant digits people read.
EFFICIENCY_KEYS = (
    ("tflops_per_gpu", channel.TFLOPS_PER_GPU),
    ("mfu", channel.MFU),
    ("step_seconds", channel.STEP_SECONDS),
    ("modeled_step_seconds", channel.MODELED_STEP_SECONDS),
)


def efficiency_of(record: Mapping[str, Any]) -> dict[str, str]:
    """TFLOP/s per GPU, MFU and the measured and modeled step times of a step record, where it has them."""
    return {key: f"{float(record[field]):.4g}" for field, key in EFFICIENCY_KEYS if record.get(field) is not None}


def network_of(verdict: Mapping[str, Any]) -> dict[str, str]:
    """The progress ConfigMap's network keys from the trainer's verdict (paralleljob_trainer.nccl_log.Verdict)."""
    keys = {"verified": channel.NETWORK_VERIFIED, "reason": channel.NETWORK_REASON, "message": channel.NETWORK_MESSAGE}
    return {key: str(verdict[field]) for field, key in keys.items() if verdict.get(field) is not None}


def create_hook() -> ProgressReporter:
    """The factory named in PARALLELJOB_PROGRESS_HOOK; configured from the pod's environment.

    PARALLELJOB_STATUS_API overrides the API URL (default: https://$KUBERNETES_SERVICE_HOST:$..._PORT).
    """
    environ = os.environ
    env = PodEnvironment.from_environ(environ, required=(environment.NAMESPACE, environment.JOB_NAME))
    host = environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    host = f"[{host}]" if ":" in host else host
    return ProgressReporter(
        env.status_api or f"https://{host}:{port}",
        str(env.namespace),
        str(env.job_name),
        interval=env.status_interval_seconds,
    )
