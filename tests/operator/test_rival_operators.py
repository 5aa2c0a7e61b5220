"""Which other operators' Leases are rivals: held, not expired, under another name, and managing some of the
same namespaces, or with disjoint namespaces announcing another admission lock
(`paralleljob.k8s.leadership.rivals`, on Leases as the API server returns them)."""

from __future__ import annotations

import dataclasses
import datetime

import kubernetes
import pytest
import yaml

from paralleljob.k8s import leadership
from paralleljob.k8s import session as k8s_session

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


OUR_LOCK = "paralleljob-system/paralleljob-admission"


@pytest.mark.parametrize(
    ("theirs", "locks"),
    [
        ("team-b-system/paralleljob-admission", ("team-b-system/paralleljob-admission", OUR_LOCK)),
        (None, ("", OUR_LOCK)),
        (OUR_LOCK, None),
    ],
    ids=["another-lock", "no-lock", "the-same-lock"],
)
def test_a_team_release_with_disjoint_namespaces_is_a_rival_only_when_it_admits_under_another_lock(theirs, locks):
    annotations = {"paralleljob.io/managed-namespaces": "team-b"}
    if theirs is not None:
        annotations["paralleljob.io/admission-lock"] = theirs
    mine = dataclasses.replace(MINE, admission_lock=OUR_LOCK)
    found = leadership.rivals([lease(metadata__annotations=annotations)], mine, NOW)
    if locks is None:
        assert found == []
    else:
        (rival,) = found
        assert (rival.lease, rival.shared, rival.locks) == ("other-ops/other-release", (), locks)
        assert rival.describe().endswith(f"admits under {locks[0] or 'no admission lock'}, this one under {OUR_LOCK}")


def test_an_operators_lease_announces_its_namespaces_and_its_admission_lock():
    session = k8s_session.from_configuration(kubernetes.client.Configuration())
    settings = dataclasses.replace(MINE, admission_lock=OUR_LOCK)
    metadata = leadership._AnnouncingLock(session, settings, "me")._announce({"name": settings.name})
    assert metadata.labels == {"paralleljob.io/operator-lease": "true"}
    assert metadata.annotations == {
        "paralleljob.io/managed-namespaces": "team-a",
        "paralleljob.io/admission-lock": OUR_LOCK,
    }
