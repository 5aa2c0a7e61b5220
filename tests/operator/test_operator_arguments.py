"""The operator's duration flags: a positive number of seconds, or 0 or more where 0 means "never" or "at once"."""

from __future__ import annotations

import argparse

import pytest

from paralleljob.commands.operator import nonnegative_seconds, positive_seconds


@pytest.mark.parametrize("text", ["0", "-1", "soon", ""])
def test_a_positive_duration_refuses_zero_negatives_and_words(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected a positive number of seconds"):
        positive_seconds(text)


@pytest.mark.parametrize("text", ["-0.5", "later"])
def test_a_nonnegative_duration_refuses_negatives_and_words(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected a number of seconds, 0 or more"):
        nonnegative_seconds(text)


def test_durations_read_as_seconds() -> None:
    assert positive_seconds("2.5") == 2.5
    assert nonnegative_seconds("0") == 0.0
