"""Fuzzed Kueue Workload states: whatever mix of conditions and admission Kueue (or a person with kubectl) leaves
on a job's Workload, the operator's reading of it never raises and never contradicts itself: an evicted or
finished Workload never lets the gang run, an eviction always has a reason, and a waiting job always has a
message to show.

The Workloads are shaped as Kueue's CRD lets them be stored (conditions are objects with a type and a status),
with every combination of the conditions the operator reads, in any order, repeated or missing fields.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from paralleljob.manifests import workload as wl

KINDS = [wl.QUOTA_RESERVED, wl.ADMITTED, wl.EVICTED, wl.FINISHED, "PodsReady", "Requeued"]
conditions = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(KINDS), "status": st.sampled_from(["True", "False", "Unknown"])},
        optional={"reason": st.text(max_size=8), "message": st.text(max_size=20)},
    ),
    max_size=6,
)
admissions = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {
            "clusterQueue": st.text(max_size=8),
            "podSetAssignments": st.lists(
                st.fixed_dictionaries(
                    {"name": st.just("main")},
                    optional={
                        "flavors": st.dictionaries(st.sampled_from(["cpu", "nvidia.com/gpu"]), st.text(max_size=6))
                    },
                ),
                max_size=2,
            ),
        }
    ),
)
workloads = st.builds(
    lambda conds, admission: {"status": {"conditions": conds, **({"admission": admission} if admission else {})}},
    conditions,
    admissions,
)


@settings(max_examples=300, deadline=None)
@given(workloads)
def test_any_workload_state_is_read_without_contradiction(found: dict[str, Any]) -> None:
    admitted, evicted = wl.admitted(found), wl.eviction(found)
    assert not (admitted and evicted is not None)
    assert not (admitted and wl.is_true(found, wl.FINISHED))
    if evicted is not None:
        reason, message = evicted
        assert reason and isinstance(message, str)
    assert wl.waiting_message(found).strip()
    names = wl.flavors(found)
    assert len(names) == len(set(names))
    assert isinstance(wl.cluster_queue(found), str)
