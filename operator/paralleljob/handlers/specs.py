"""Which spec a pass acts on: the job's current spec resolved and checked (the API's rules, the env names the
operator sets, the administrator's admission policy), or the spec the live attempt was admitted with, pinned in
its record.
"""

from __future__ import annotations

from paralleljob.api import ResolvedJob, policy, validate_document
from paralleljob.api import types as api_types
from paralleljob.handlers import placement
from paralleljob.handlers.passes import Pass
from paralleljob.manifests import pods as pod_manifests
from paralleljob.manifests import records


def current_spec(p: Pass) -> tuple[ResolvedJob | None, str]:
    """The job's current spec resolved (its chosen layout applied), or None with why it is invalid: the API's
    rules, no `spec.template.env` name the operator sets, and the administrator's admission policy."""
    result = validate_document(p.job)
    problems = [problem.render() for problem in result.problems if problem.severity == "error"]
    if result.resolved is not None and result.ok:
        problems += pod_manifests.env_problems(result.resolved)
        problems += [found.render() for found in policy.check_policy(result.resolved.spec, p.settings.admission_policy)]
    if result.resolved is None or problems:
        return None, "; ".join(problems)
    resolved = result.resolved
    choice = p.record.layout_choice if p.record is not None else None
    if resolved.needs_layout and choice:
        # Chosen once, at first admission, and recorded: restarts re-place this layout, they never search again.
        chosen, layout_problems = placement.chosen_job(resolved, choice)
        if chosen is None:
            return None, "; ".join(problem.render() for problem in layout_problems)
        return chosen, ""
    return resolved, ""


def pinned_spec(p: Pass, current: ResolvedJob | None) -> ResolvedJob:
    """The spec the live attempt was admitted with, from its record: its pods are all built from it, and it is
    supervised by it, whatever was edited since. The current spec only for a job without a record."""
    if p.record is None:
        if current is None:
            raise ValueError("the job has no attempt record and its spec is invalid")
        return current
    if current is not None and records.same_spec(p.record, api_types.spec_to_dict(current.spec)):
        return current  # not edited since admission (every pass but the few after an edit): validated once
    result = validate_document(records.pinned_document(p.record, p.name, p.namespace))
    if result.resolved is None or not result.ok:
        problems = "; ".join(problem.render() for problem in result.problems if problem.severity == "error")
        raise ValueError(f"the pinned spec of attempt {p.record.attempt} no longer validates: {problems}")
    return result.resolved
