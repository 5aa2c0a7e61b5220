"""The strict cluster's model of an operator killed mid-pass, which the kill loop uses: after a set number of the
operator's requests every further one is refused 503; optionally the last one is carried out with its answer lost,
as when the process dies between sending a create and reading the reply. Other clients are not affected."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.conftest import Client

CONFIGMAPS = "/api/v1/namespaces/research/configmaps"


def configmap(name: str) -> dict:
    return {"metadata": {"name": name}, "data": {}}


@pytest.fixture
def operator(cluster, admin) -> Iterator[Client]:
    yield Client(cluster, cluster.server.tokens.admin_token, agent="paralleljob-operator/test")
    cluster.server.operator_outage_after = None
    cluster.server.operator_outage_loses_last_answer = False


def names(admin: Client) -> set[str]:
    return {item["metadata"]["name"] for item in admin.ok(admin.send("GET", CONFIGMAPS))["items"]}


@pytest.mark.parametrize("answer_lost", [False, True], ids=["refused-before", "answer-lost"])
def test_the_outage_starts_after_the_counted_requests(cluster, admin, operator, answer_lost):
    prefix = "lost" if answer_lost else "cut"
    cluster.server.operator_outage_loses_last_answer = answer_lost
    cluster.server.operator_outage_after = 2
    assert operator.create(CONFIGMAPS, configmap(f"{prefix}-1")).status_code == 201
    last = operator.create(CONFIGMAPS, configmap(f"{prefix}-2"))
    assert last.status_code == (503 if answer_lost else 201)
    assert operator.create(CONFIGMAPS, configmap(f"{prefix}-3")).status_code == 503
    # The lost answer's create took effect all the same; nothing after it did.
    assert {f"{prefix}-1", f"{prefix}-2", f"{prefix}-3"} & names(admin) == {f"{prefix}-1", f"{prefix}-2"}


def test_other_clients_are_served_during_the_outage(cluster, admin, operator):
    cluster.server.operator_outage_after = 0
    assert operator.create(CONFIGMAPS, configmap("by-operator")).status_code == 503
    assert admin.create(CONFIGMAPS, configmap("by-admin")).status_code == 201
    assert "by-operator" not in names(admin)
