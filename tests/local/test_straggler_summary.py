"""`paralleljob run`'s summary of the trainer's `stragglers` windows: one entry per node any window named."""

from __future__ import annotations

from paralleljob.local import report

NODES = ["local-0", "local-1", "local-2", "local-3"]


def window(first: int, last: int, *named: tuple[int, float, int]) -> dict:
    entries = [{"nodeRank": r, "factor": f, "stage": s, "steps": [first, last]} for r, f, s in named]
    return {"event": "stragglers", "steps": [first, last], "stragglers": entries}


def test_each_named_node_once_with_its_largest_factor_and_the_steps_that_named_it() -> None:
    windows = [window(1, 20, (1, 2.3, 0)), window(21, 40, (1, 2.6, 0), (3, 1.4, 1)), window(41, 60, (1, 1.8, 0))]
    assert report.straggler_summary(windows, NODES) == [
        {"node": "local-1", "nodeRank": 1, "factor": 2.6, "stage": 0, "steps": [1, 60], "windows": "3/3"},
        {"node": "local-3", "nodeRank": 3, "factor": 1.4, "stage": 1, "steps": [21, 40], "windows": "1/3"},
    ]


def test_a_report_over_a_run_of_windows_counts_each_of_them() -> None:
    """The trainer names a node after two slow windows in a row, over both; a third extends the run."""
    windows = [window(1, 20), window(21, 40), window(41, 60), window(61, 80)]
    windows[1]["stragglers"] = [{"nodeRank": 1, "factor": 5.1, "stage": 0, "steps": [1, 40]}]
    windows[2]["stragglers"] = [{"nodeRank": 1, "factor": 4.8, "stage": 0, "steps": [1, 60]}]
    assert report.straggler_summary(windows, NODES) == [
        {"node": "local-1", "nodeRank": 1, "factor": 5.1, "stage": 0, "steps": [1, 60], "windows": "3/4"}
    ]


def test_no_window_named_anyone() -> None:
    assert report.straggler_summary([window(1, 20), window(21, 40)], NODES) == []
    assert report.straggler_summary([], NODES) == []
