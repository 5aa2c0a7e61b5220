"""`paralleljob run --throttle-node`'s cgroup: bad values are named, the quota is the node's share."""

from __future__ import annotations

import pathlib

import pytest

from paralleljob.local import throttle


@pytest.mark.parametrize(
    ("node", "share", "message"),
    [(4, 0.33, "node ranks 0-3"), (1, 0.0, r"\(0, 1\]"), (1, 1.5, r"\(0, 1\]")],
)
def test_bad_throttles_are_named(node: int, share: float, message: str, tmp_path: pathlib.Path) -> None:
    with pytest.raises(throttle.ThrottleError, match=message):
        throttle.make(node, share, 4, "test", root=tmp_path)


def test_a_v1_cpu_cgroup_gets_the_quota_and_the_node_joins_it(tmp_path: pathlib.Path) -> None:
    (tmp_path / "cpu").mkdir()  # a v1 hierarchy: no cgroup.controllers at the root
    made = throttle.make(1, 0.5, 4, "test", root=tmp_path)
    assert made.cores == pytest.approx(0.5 * throttle.os.cpu_count() / 4)
    assert (made.path / "cpu.cfs_quota_us").read_text() == f"{max(1000, int(made.cores * throttle.PERIOD_US))}\n"
    wrapped = made.wrap(["python", "-m", "x"])
    assert wrapped[-3:] == ["python", "-m", "x"] and str(made.path / "cgroup.procs") in wrapped[2]


def test_a_v2_hierarchy_gets_cpu_max(tmp_path: pathlib.Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory\n")
    made = throttle.make(0, 1.0, 2, "test", root=tmp_path)
    assert (made.path / "cpu.max").read_text().endswith(f" {throttle.PERIOD_US}\n")


def test_no_writable_cgroup_is_one_line(tmp_path: pathlib.Path) -> None:
    with pytest.raises(throttle.ThrottleError, match="needs a writable CPU cgroup"):
        throttle.make(0, 0.5, 2, "test", root=tmp_path / "missing")
