"""``auto``'s options are defined once (``AutoOptions``): every entry point takes the same
names with the same defaults, and checks them the same way."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest

import instrument
from instrument.options import DEFAULTS, AutoOptions

FIELDS = {field.name: field.default for field in dataclasses.fields(AutoOptions)}


def _entry_points() -> dict[str, Callable[..., Any]]:
    points: dict[str, Callable[..., Any]] = {"auto": instrument.auto}
    try:
        from instrument.integrations import transformers

        points["transformers.InstrumentCallback"] = transformers.InstrumentCallback
    except ImportError:
        pass
    for package in ("lightning", "pytorch_lightning"):
        try:
            module = __import__(f"instrument.integrations.{package}", fromlist=["_"])
        except ImportError:
            continue
        points[f"{package}.InstrumentCallback"] = module.InstrumentCallback
        points[f"{package}.InstrumentProfiler"] = module.InstrumentProfiler
    return points


#: Where an entry point's default means something of its own (documented there).
OWN_DEFAULTS = {("transformers.InstrumentCallback", "every"): None}  # the logging_steps


@pytest.mark.parametrize("name", sorted(_entry_points()))
def test_every_entry_point_takes_the_options_with_their_defaults(name: str) -> None:
    parameters = inspect.signature(_entry_points()[name]).parameters
    for option, default in FIELDS.items():
        assert option in parameters, f"{name} lacks {option}="
        expected = OWN_DEFAULTS.get((name, option), default)
        assert parameters[option].default == expected, f"{name}'s {option} default"
        assert parameters[option].kind in (
            inspect.Parameter.KEYWORD_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        )


def test_the_defaults_are_read_from_one_place() -> None:
    assert dataclasses.asdict(DEFAULTS) == FIELDS
    auto = inspect.signature(instrument.auto).parameters
    assert [o for o in auto if o in FIELDS] == [o for o in auto if o in FIELDS]  # all present
    assert AutoOptions().reporter_options_changed() == []


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"depth": -1}, ValueError, "level"),
        ({"backward": "no"}, ValueError, "unknown backward 'no'"),
        ({"clock": "sundial"}, ValueError, "sundial"),
        ({"every": 0}, ValueError, "every"),
        ({"normalizer": "epochs"}, ValueError, "unknown normalizer"),
        ({"ranks": "most"}, ValueError, "unknown ranks 'most'"),
        ({"peak_flops": -1}, ValueError, "peak_flops"),
        ({"reporter": "r"}, TypeError, "reporter must be an instrument.Reporter"),
    ],
)
def test_bad_options_name_the_problem(options: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        AutoOptions(**options)


def test_a_reporter_and_reporter_options_together_are_refused() -> None:
    reporter = instrument.Reporter(sinks=[])
    try:
        with pytest.raises(ValueError, match="every=/ranks="):
            AutoOptions(reporter=reporter, every=10, ranks="all")
        made = AutoOptions(every=10, sinks=[]).with_reporter(reporter)
        assert made.reporter is reporter
        assert made.every == DEFAULTS.every
    finally:
        reporter.close(flush=False)


def test_ranks_max_is_minmax_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match='ranks="minmax"'):
        options = AutoOptions(ranks="max")
    assert options.ranks == "minmax"
