"""The one metrics.jsonl reader (paralleljob_contract.metrics): whole records only, the last of a step counts."""

from __future__ import annotations

from pathlib import Path

from paralleljob_contract import metrics


def test_a_half_written_line_is_left_out_and_kept_for_the_next_read() -> None:
    records, rest = metrics.complete_records(b'{"event": "step", "step": 1}\nnot json\n[1]\n{"event": "st')
    assert records == [{"event": "step", "step": 1}]
    assert rest == b'{"event": "st'


def test_a_file_is_read_whole_with_its_last_line_and_a_restarted_step_keeps_its_last_record(tmp_path: Path) -> None:
    path = tmp_path / metrics.FILE
    assert metrics.read_records(path) == []
    path.write_text(
        '{"event": "step", "step": 1, "loss": 3.0}\n{"event": "resume", "step": 0}\n'
        '{"event": "step", "step": 1, "loss": 2.5}\n{"event": "step", "step": 2, "loss": 2.0}'
    )
    steps = metrics.read_records(path, "step")
    assert [r["loss"] for r in steps] == [3.0, 2.5, 2.0]
    assert {step: r["loss"] for step, r in metrics.last_by_step(steps).items()} == {1: 2.5, 2: 2.0}
    assert [r["event"] for r in metrics.read_records(path)] == ["step", "resume", "step", "step"]
