"""The strict cluster keeps no record of answered requests in kmock: kmock routes each request by scanning that
record, so a record that grows with the test makes every request slower than the last (a 50-kill loop took
quadratically long). What tests look at is the server's own `calls`."""

from __future__ import annotations


def test_answered_requests_leave_kmocks_record_and_stay_in_the_servers_calls(cluster, admin):
    before = len(cluster.server.calls)
    for _ in range(50):
        admin.ok(admin.send("GET", "/api/v1/namespaces/research/configmaps"))
    assert len(cluster.server.calls) - before == 50
    assert len(cluster.server._requests) == 0
