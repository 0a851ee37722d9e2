"""Bad region arguments are refused when the region is built, naming what is wrong."""

from __future__ import annotations

from datetime import timedelta

import pytest

import instrument


@pytest.mark.parametrize(
    ("timeout", "error"),
    [(-5, ValueError), (0, ValueError), (timedelta(0), ValueError), ("1s", TypeError)],
)
def test_a_bad_barrier_timeout_is_refused_by_timed(timeout: object, error: type) -> None:
    with pytest.raises(error, match=r"barrier_timeout must be .*, got " + repr(timeout)[:3]):
        instrument.timed("b", barrier=True, barrier_timeout=timeout)  # type: ignore[arg-type]


def test_a_good_barrier_timeout_is_taken() -> None:
    instrument.timed("b", barrier=True, barrier_timeout=2.5)
    instrument.timed("b", barrier=True, barrier_timeout=timedelta(seconds=1))


@pytest.mark.parametrize("name", ["a\nb", "tab\there", "nul\x00", "bell\x07", "del\x7f"])
def test_region_names_with_control_characters_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="control character"):
        instrument.timed(name)
    with pytest.raises(ValueError, match="control character"):
        instrument.Timer(name)


def test_printable_names_with_spaces_and_unicode_are_fine() -> None:
    instrument.timed("forward pass")
    instrument.timed("étape · 1")


@pytest.mark.parametrize("name", ["(other)", "(overflow)", "(instrument flush)"])
def test_the_names_of_instrument_s_own_rows_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="reserved for instrument's own rows"):
        instrument.timed(name)
    with pytest.raises(ValueError, match="reserved"):
        instrument.Timer(name)
    with pytest.raises(ValueError, match="reserved"):
        instrument.timed(name)(lambda: None)
    instrument.timed(f"{name} of mine")  # only the exact names


def test_a_name_that_is_not_valid_text_is_refused() -> None:
    name = b"load_\xff.bin".decode("utf-8", "surrogateescape")  # a non-UTF-8 file name
    with pytest.raises(ValueError, match="not valid text"):
        instrument.timed(name)
    instrument.timed(b"load_\xff.bin".decode("utf-8", "replace"))
