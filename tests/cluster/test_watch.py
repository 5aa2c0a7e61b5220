"""Watches from a resourceVersion, as kube-apiserver serves them: a client that lists and then watches from the
listing's version sees every change in between, a deletion included (informers depend on it)."""

from __future__ import annotations

import json

CONFIGMAPS = "/api/v1/namespaces/research/configmaps"


def configmap(name: str) -> dict:
    return {"metadata": {"name": name}, "data": {"k": "v"}}


def watch_events(admin, version: str, count: int) -> list[tuple[str, str]]:
    """The first `count` events of a watch from `version`: (type, name), or (ERROR, reason)."""
    found: list[tuple[str, str]] = []
    with admin.send(
        "GET", CONFIGMAPS, stream=True, watch="true", resourceVersion=version, timeoutSeconds="5"
    ) as response:
        for line in response.iter_lines():
            event = json.loads(line)
            obj = event["object"]
            found.append((event["type"], obj.get("reason") if event["type"] == "ERROR" else obj["metadata"]["name"]))
            if len(found) == count:
                break
    return found


def test_a_watch_from_the_listed_version_sees_a_deletion_made_between_the_list_and_the_watch(admin):
    admin.ok(admin.create(CONFIGMAPS, configmap("kept")))
    admin.ok(admin.create(CONFIGMAPS, configmap("gone")))
    version = admin.ok(admin.send("GET", CONFIGMAPS))["metadata"]["resourceVersion"]
    admin.ok(admin.send("DELETE", f"{CONFIGMAPS}/gone"))
    admin.ok(admin.create(CONFIGMAPS, configmap("new")))
    assert watch_events(admin, version, 2) == [("DELETED", "gone"), ("ADDED", "new")]


def test_a_version_older_than_the_watch_cache_is_answered_410_expired(admin):
    server = admin.cluster.server
    before, server.watch_cache_events = server.watch_cache_events, 2
    try:
        first = admin.ok(admin.create(CONFIGMAPS, configmap("first")))["metadata"]["resourceVersion"]
        for name in ("second", "third", "fourth"):
            admin.ok(admin.create(CONFIGMAPS, configmap(name)))
        assert watch_events(admin, first, 1) == [("ERROR", "Expired")]
    finally:
        server.watch_cache_events = before
