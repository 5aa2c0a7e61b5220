"""The house rule that no module under operator/ or trainer-image/ is over 450 lines, checked so it stays kept."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIMIT = 450


def test_no_module_under_operator_or_trainer_image_is_over_450_lines() -> None:
    modules = [path for top in ("operator", "trainer-image") for path in (REPO / top).rglob("*.py")]
    assert modules
    too_long = {str(p.relative_to(REPO)): n for p in modules if (n := len(p.read_text().splitlines())) > LIMIT}
    assert too_long == {}
