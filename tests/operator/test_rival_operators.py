"""Which other operators' Leases are rivals: held, not expired, under another name, and managing some of the
same namespaces (`paralleljob.k8s.leadership.rivals`, on Leases as the API server returns them)."""

from __future__ import annotations

import dataclasses
import datetime

import pytest
import yaml

from paralleljob.k8s import leadership

NOW = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.UTC)
MINE = leadership.LeaseSettings(name="pj-paralleljob-operator", namespace="paralleljob-system", managed=("team-a",))
LEASE_YAML = """
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata:
  name: other-release
  namespace: other-ops
  labels: {paralleljob.io/operator-lease: "true"}
  annotations: {paralleljob.io/managed-namespaces: "*"}
spec:
  holderIdentity: operator-2
  leaseDurationSeconds: 15
  renewTime: "2026-12-01T11:59:55.000000Z"
"""


def lease(**changes) -> dict:
    doc = yaml.safe_load(LEASE_YAML)
    for path, value in changes.items():
        section, key = path.split("__")
        doc[section][key] = value
    return doc


@pytest.mark.parametrize(
    ("managed", "theirs", "shared"),
    [
        (None, "*", None),
        (("team-a",), "*", ("team-a",)),
        (("team-a",), "team-a,team-b", ("team-a",)),
        (None, None, None),
    ],
    ids=["two-cluster-wide-releases", "team-release-under-cluster-wide", "overlapping-team-releases", "unannotated"],
)
def test_a_fresh_lease_of_another_operator_managing_my_namespaces_is_a_rival(managed, theirs, shared):
    annotations = {} if theirs is None else {"paralleljob.io/managed-namespaces": theirs}
    mine = dataclasses.replace(MINE, managed=managed)
    (rival,) = leadership.rivals([lease(metadata__annotations=annotations)], mine, NOW)
    assert (rival.lease, rival.holder, rival.shared) == ("other-ops/other-release", "operator-2", shared)


@pytest.mark.parametrize(
    "other",
    [
        lease(metadata__annotations={"paralleljob.io/managed-namespaces": "team-b"}),
        lease(spec__renewTime="2026-12-01T11:59:30.000000Z"),
        lease(spec__holderIdentity=None),
        lease(metadata__name="pj-paralleljob-operator", metadata__namespace="paralleljob-system"),
    ],
    ids=["disjoint-team-release", "expired", "released", "my-own-lease"],
)
def test_no_rival_where_the_namespaces_are_disjoint_the_lease_expired_or_it_is_mine(other):
    assert leadership.rivals([other], MINE, NOW) == []
