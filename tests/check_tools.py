"""Helpers shared by the tests of the exercise checks."""
import pytest

from coursework import ExerciseError


def fails_with(check, *args, words=()):
    """Run a check that must fail; return its message after testing the words in it."""
    with pytest.raises(ExerciseError) as info:
        check(*args)
    message = str(info.value)
    for word in words:
        assert word in message, f"expected {word!r} in: {message}"
    return message
