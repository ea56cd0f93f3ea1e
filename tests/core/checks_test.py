"""The one module of argument checks: one exception type per mistake."""

from __future__ import annotations

import pytest

from tf_crossdevice._core import checks as _checks


@pytest.mark.parametrize("value", [0, 1, 7])
def test_non_negative_int_returns_the_value(value):
    assert _checks.non_negative_int(value, "num_packs") == value


@pytest.mark.parametrize(
    "check, value, error, message",
    [
        (_checks.non_negative_int, -1, ValueError, "an int >= 0, got -1"),
        (_checks.non_negative_int, 1.0, TypeError, "got float 1.0"),
        (_checks.non_negative_int, True, TypeError, "got bool True"),
        (_checks.non_negative_int, "2", TypeError, "got str '2'"),
        (_checks.positive_int, 0, ValueError, "an int >= 1, got 0"),
        (_checks.positive_int, None, TypeError, "got NoneType None"),
    ],
    ids=lambda x: getattr(x, "__name__", repr(x)),
)
def test_wrong_type_is_type_error_and_bad_value_is_value_error(
    check, value, error, message
):
    with pytest.raises(error) as info:
        check(value, "worker_devices[1]")
    assert str(info.value).startswith("worker_devices[1]: expected an int")
    assert message in str(info.value)


def test_integer_without_a_minimum_takes_negatives():
    assert _checks.integer(-3, "axis") == -3
    with pytest.raises(TypeError, match="^axis: expected an int, got"):
        _checks.integer(0.5, "axis")


def test_index_names_how_many_there_are():
    assert _checks.index(2, "task", 3, "a task") == 2
    with pytest.raises(
        ValueError, match=r"^task: expected a task index below 3, got 3$"
    ):
        _checks.index(3, "task", 3, "a task")
    with pytest.raises(ValueError, match=r"^index: expected an int >= 0"):
        _checks.index(-1, "index", 3, "a host")
    with pytest.raises(TypeError, match=r"^index: expected an int >= 0"):
        _checks.index(1.0, "index", 3, "a host")


def test_one_of_lists_what_is_allowed():
    assert _checks.one_of("RING", "implementation", ["AUTO", "RING"]) == "RING"
    with pytest.raises(
        ValueError,
        match="^implementation: unknown value 'ring'; expected one of AUTO, "
        "RING$",
    ):
        _checks.one_of("ring", "implementation", ["AUTO", "RING"])


@pytest.mark.parametrize(
    "value, error, message",
    [
        ("/cpu:0", TypeError, "^devices: expected a list of device strings"),
        (3, TypeError, "^devices: expected a list of device strings"),
        ([], ValueError, "^devices: expected at least one device string"),
        (["/cpu:0", 1], TypeError, r"^devices\[1\]: expected a device string"),
    ],
    ids=repr,
)
def test_string_list(value, error, message):
    with pytest.raises(error, match=message):
        _checks.string_list(value, "devices", "device string")


def test_string_list_gives_a_list():
    assert _checks.string_list(("a", "b"), "devices") == ["a", "b"]
    assert _checks.string_list([], "devices", allow_empty=True) == []
