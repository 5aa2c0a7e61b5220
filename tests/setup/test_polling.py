"""The one polling helper (testcluster.polling) the tests, benches and the test cluster wait with."""

from __future__ import annotations

import pytest

from testcluster.polling import holds_for, wait_for, wait_until_steady


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


def test_a_value_is_returned_once_it_stops_changing_and_a_value_that_never_settles_times_out() -> None:
    counts = iter([1, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3])
    last = {"value": 0}

    def count() -> int:
        last["value"] = next(counts, last["value"])
        return last["value"]

    assert wait_until_steady(count, 0.05, 5, "the count", interval=0.01) == 3
    ticks = iter(range(10**6))
    with pytest.raises(TimeoutError, match=r"waiting for the ticks \(unchanged for 0.05 s\)"):
        wait_until_steady(lambda: next(ticks), 0.05, 0.3, "the ticks", interval=0.001)


def test_holds_for_says_whether_a_condition_stayed_true_the_whole_time() -> None:
    assert holds_for(lambda: True, 0.05, interval=0.01)
    answers = iter([True, True, False, True])
    assert not holds_for(lambda: next(answers, True), 5, interval=0.001)  # False at its first falsy answer
