"""The cluster-wide admission lock (`paralleljob.k8s.admission_lock`) on the upstream API server, as the chart's
ServiceAccount with the chart's RBAC for that one Lease: one holder at a time, a dead holder's lock free again
once a waiter has seen it unchanged for its duration (whatever the clocks say: this API server's is an hour
behind the operator's), the times written in the server's clock, a hold too old to write under refused, and a
late release that leaves a new holder alone."""

from __future__ import annotations

import dataclasses
import datetime
import time

import kubernetes
import pytest

from paralleljob.commands import operator as operator_command
from paralleljob.k8s import admission_lock
from paralleljob.k8s import session as k8s_session
from testcluster.server import UpstreamServer
from tests.operator.helpers import install_operator_rbac

AN_HOUR = 3600.0


@pytest.fixture
def apiserver(apiserver: UpstreamServer) -> UpstreamServer:
    """An API server whose clock is an hour behind the operator's: every answer's Date says so (the proxy)."""
    apiserver.clock_offset = -AN_HOUR
    return apiserver


@pytest.fixture
def session(apiserver: UpstreamServer, cluster) -> k8s_session.Session:
    return k8s_session.connect(str(install_operator_rbac(apiserver, cluster.client)))


# The Lease every operator takes by default, as the chart's RBAC grants it.
DEFAULT = admission_lock.LockSettings.parse(operator_command.DEFAULT_ADMISSION_LOCK)


def lock(session: k8s_session.Session, holder: str, hold_seconds: int = 30, wait: float = 1.0):
    settings = dataclasses.replace(DEFAULT, hold_seconds=hold_seconds, wait_seconds=wait)
    return admission_lock.AdmissionLock(session, settings, holder)


def lease_holder(cluster) -> str | None:
    api = kubernetes.client.CoordinationV1Api(cluster.client)
    return api.read_namespaced_lease(DEFAULT.name, DEFAULT.namespace).spec.holder_identity


def test_one_holder_at_a_time_and_the_next_one_takes_it_once_released(session, cluster):
    first, second = lock(session, "operator-a"), lock(session, "operator-b")
    with first.held():
        assert lease_holder(cluster) == "operator-a"
        with pytest.raises(admission_lock.LockBusy, match="held by operator-a"), second.held():
            pass
    assert lease_holder(cluster) is None
    with second.held():
        assert lease_holder(cluster) == "operator-b"


def test_a_dead_holders_lock_is_free_once_seen_unchanged_for_its_duration(session, cluster):
    lock(session, "operator-a", hold_seconds=2)._take()  # taken, never released: the operator died
    started = time.monotonic()
    with lock(session, "operator-b", wait=10.0).held():
        waited = time.monotonic() - started
        assert lease_holder(cluster) == "operator-b"
    assert 1.0 <= waited < 6.0, f"took the dead holder's lock after {waited:.1f}s (its duration is 2s)"


def test_a_hold_older_than_its_safe_part_refuses_to_write(session):
    with lock(session, "operator-a", hold_seconds=1).held() as hold:
        hold.check()  # fresh: fine
        time.sleep(0.8)  # past 2/3 of the duration
        with pytest.raises(admission_lock.HoldExpired, match="retried"):
            hold.check()


def test_a_late_release_leaves_the_next_holder_alone(session, cluster):
    late = lock(session, "operator-a", hold_seconds=1)
    with late.held():
        time.sleep(2.5)  # expired on the server's clock (the Date header has whole seconds)
        # b sees a's Lease unchanged for its 1 s duration before taking it: a wait of 1 s would race that
        with lock(session, "operator-b", hold_seconds=30, wait=10.0).held():
            pass  # b took it and released it: free again
        lock(session, "operator-c")._take()
    assert lease_holder(cluster) == "operator-c"


def test_the_lease_is_written_in_the_servers_time_even_when_the_first_answer_was_a_refusal(session, cluster):
    lock(session, "operator-a")._take()  # the Lease's first read is a 404: the session learns the clock from it
    api = kubernetes.client.CoordinationV1Api(cluster.client)
    acquired = api.read_namespaced_lease(DEFAULT.name, DEFAULT.namespace).spec.acquire_time
    server_now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=AN_HOUR)
    assert abs((acquired - server_now).total_seconds()) < 5
