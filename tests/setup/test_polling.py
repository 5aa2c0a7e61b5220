"""The one polling helper (testcluster.polling) the tests, benches and the test cluster wait with."""

from __future__ import annotations

import pytest

from testcluster.polling import wait_for


def test_it_returns_the_first_truthy_answer_and_tolerates_only_what_it_is_told() -> None:
    answers = iter([None, LookupError("not yet"), 0, "ready", "later"])

    def answer() -> object:
        found = next(answers)
        if isinstance(found, Exception):
            raise found
        return found

    assert wait_for(answer, 5, "ready", interval=0.001, tolerate=(LookupError,)) == "ready"
    with pytest.raises(LookupError):
        wait_for(lambda: (_ for _ in ()).throw(LookupError("gone")), 5, "anything", interval=0.001)


def test_a_timeout_names_what_it_waited_for_and_the_last_answer() -> None:
    with pytest.raises(TimeoutError, match=r"waiting for the pods; last: \[\]"):
        wait_for(list, 0.05, "the pods", interval=0.01)
