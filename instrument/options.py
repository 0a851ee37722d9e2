"""The options of :func:`instrument.auto` that every integration shares, defined once.

``auto`` and the integrations (the HF ``InstrumentCallback``, the Lightning
``InstrumentCallback`` / ``InstrumentProfiler``) take these as keyword arguments with the
same names and defaults (``tests/test_options.py`` checks their signatures against
:class:`AutoOptions`); each builds one :class:`AutoOptions`, which validates them, makes the
reporter, and hands the hook options on to ``auto``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from instrument import clocks
from instrument.diagnosis import Thresholds
from instrument.hooks import modules as module_hooks
from instrument.regions.region import check_level
from instrument.reporter import (
    Reporter,
    check_flops,
    check_normalizer,
    check_peak_flops,
    check_ranks,
)
from instrument.stepcounter import check_every

#: The options that configure the reporter ``auto`` makes (left alone with ``reporter=``).
REPORTER_OPTIONS = (
    "every",
    "sinks",
    "normalizer",
    "flops_per_step",
    "peak_flops",
    "ranks",
    "diagnose",
)
#: The options that say what ``auto`` hooks.
HOOK_OPTIONS = ("depth", "include", "exclude", "backward", "collectives", "clock")


@dataclasses.dataclass(frozen=True)
class AutoOptions:
    """What ``auto`` times and how it reports; see :func:`instrument.auto` for each option.

    Made with bad values, it raises the error ``auto`` raises (``ValueError`` /
    ``TypeError`` naming the option), so an integration fails when it is constructed.
    """

    every: int | None = 50
    depth: int | None = None
    include: str | type | Iterable[str | type] | None = None
    exclude: str | type | Iterable[str | type] | None = None
    backward: bool | str = True
    collectives: bool = True
    clock: object = "auto"
    sinks: Iterable[Any] | None = None
    reporter: Reporter | None = None
    normalizer: float | str = "steps"
    flops_per_step: float | str | None = None
    peak_flops: float | None = None
    ranks: str = "local"
    diagnose: bool | Thresholds = True

    def __post_init__(self) -> None:
        if self.depth is not None:
            check_level(self.depth)
        module_hooks.check_patterns(self.include, "include")
        module_hooks.check_patterns(self.exclude, "exclude")
        if not (self.backward is True or self.backward is False or self.backward == "modules"):
            raise ValueError(
                f"unknown backward {self.backward!r}; expected one of True, False, 'modules'"
            )
        clocks.check_clock(self.clock)
        if self.reporter is not None:
            changed = self.reporter_options_changed()
            if changed:
                given = "/".join(f"{name}=" for name in changed)
                raise ValueError(
                    f"pass either reporter= or {given} (they configure the reporter that is "
                    "made otherwise), not both"
                )
            if not isinstance(self.reporter, Reporter):
                raise TypeError(
                    f"reporter must be an instrument.Reporter, got {type(self.reporter).__name__}"
                )
        check_every(self.every)
        check_normalizer(self.normalizer)
        check_flops(self.flops_per_step)
        check_peak_flops(self.peak_flops)
        object.__setattr__(self, "ranks", check_ranks(self.ranks))

    def reporter_options_changed(self) -> list[str]:
        """The reporter options set to something other than their default."""
        return [name for name in REPORTER_OPTIONS if getattr(self, name) != _DEFAULTS[name]]

    def with_reporter(self, reporter: Reporter) -> AutoOptions:
        """These options with ``reporter`` (a made one) and the reporter options unset."""
        unset = {name: _DEFAULTS[name] for name in REPORTER_OPTIONS}
        return dataclasses.replace(self, reporter=reporter, **unset)

    @property
    def region_clock(self) -> object:
        """The clock for the regions the hooks open (``None``: the configured one)."""
        return None if self.clock == "auto" else self.clock

    def hook_options(self) -> dict[str, Any]:
        """The options that say what is hooked, by name."""
        return {name: getattr(self, name) for name in HOOK_OPTIONS}

    def make_reporter(self, sinks: Iterable[Any] | None = None) -> Reporter:
        """The reporter these options describe (``sinks`` in place of ``self.sinks``)."""
        return Reporter(
            every=self.every,
            sinks=self.sinks if sinks is None else sinks,
            normalizer=self.normalizer,
            flops_per_step=self.flops_per_step,
            peak_flops=self.peak_flops,
            ranks=self.ranks,
            diagnose=self.diagnose,
        )


_DEFAULTS: dict[str, Any] = {field.name: field.default for field in dataclasses.fields(AutoOptions)}
#: The defaults, one attribute each: the entry points' signatures read them from here.
DEFAULTS = AutoOptions()
