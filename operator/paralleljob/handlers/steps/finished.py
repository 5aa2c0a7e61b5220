"""Step 1, finished: a job whose attempt record says Succeeded or Failed. Its end is final: an edit afterwards
changes only the Valid condition, whatever the spec says now, and the pods still holding GPUs are deleted
(a Succeeded job keeps its Succeeded pods for their logs).
"""

from __future__ import annotations

from paralleljob.handlers import metrics as m
from paralleljob.handlers.passes import (
    Outcome,
    Pass,
    delete_finished_pods,
    write_status,
)
from paralleljob.handlers.specs import current_spec
from paralleljob.k8s import reads
from paralleljob.manifests import labels


def rest(p: Pass) -> Outcome:
    """A finished job, first of all: its end stands whatever its spec says now. An edit afterwards changes only
    the Valid condition (False while the spec is invalid, True again once it is fixed), and the pods still
    holding GPUs are deleted."""
    current, problems = current_spec(p)
    cond = p.condition("Valid", *valid_after_end(problems if current is None else None))
    write_status(p, {"conditions": cond})
    m.observe_phase(p.namespace, p.name, p.status.get("phase"))
    pods = [pod for pod in reads.list_job_pods(p.session, p.namespace, p.name) if labels.owned_by(pod, p.uid)]
    delete_finished_pods(p, pods)
    return Outcome("finished")


def valid_after_end(problems: str | None) -> tuple[str, str, str]:
    """The Valid condition (status, reason, message) of a finished job: the only thing an edit still changes.
    `problems`: why the current spec is invalid, None when it is valid."""
    if problems is None:
        return "True", "Validated", "the spec is valid"
    return "False", "InvalidSpec", problems
