"""Weights & Biases: each report as one ``run.log`` of scalars."""

from __future__ import annotations

import logging
from typing import Any

from instrument.lifecycle import ForkSafeLock
from instrument.report import Report
from instrument.sinks import extras
from instrument.sinks.base import RankFilter, Sink, only_ranks_option
from instrument.sinks.scalars import TOP, check_top, global_step, scalars

logger = logging.getLogger("instrument")

INSTALL_HINT = 'WandB sink needs wandb: pip install "torch-instrument[wandb]"'
STEP_MODES = ("report", "run")
STEP_KEY = "instrument/step"


def _next_step(run: Any) -> int | None:
    """The step of the run's next row, or ``None`` when it cannot be asked. ``run.step`` asks
    wandb's service (well under a millisecond) but blocks for 30 s on a finished run, so a
    finished run is not asked: logging to it raises wandb's own "run is finished" error."""
    if getattr(run, "_is_finished", False):
        return None
    try:
        step = run.step
    except Exception:  # e.g. mode="shared" runs have no step to ask for
        return None
    return step if isinstance(step, int) else None


class WandB(Sink):
    """Log each report to a wandb run: the tags of :func:`instrument.sinks.scalars.scalars`
    (``time/<path>/mean_ms``, ``throughput/tokens_per_sec``, ...) plus ``instrument/step``
    (the report's step), each key after ``prefix``. Regions get keys for the top level and
    the ``top`` deeper regions with the most time.

    The run is ``run`` if given, else the active ``wandb.run`` at each report, else, only
    when ``init_kwargs`` were given, one the sink starts with ``wandb.init(**init_kwargs)``
    on its first report and finishes in :meth:`close`. With none of these a report raises
    ``RuntimeError`` (the reporter logs it once and goes on).

    Args:
        run: The wandb run to log to.
        only_ranks: Which ranks log: rank 0 by default (one run per job), "all", a rank, or a
            collection of ranks.
        prefix: Put before every key (``"perf"`` gives ``perf/time/...``); a ``/`` is added.
        step: ``"report"`` (default): log at ``step=`` the report's step (the steps seen so
            far), so the charts share your training steps. wandb drops data logged at a
            step below the run's current one, so when your own ``wandb.log`` calls are
            already past it (they count another unit), the report goes into the run's
            current row instead (``commit=False``) and a message says so once.
            ``"run"``: never pass a step; each report joins the row your own next
            ``wandb.log`` call commits (``commit=False`` unless ``commit`` says otherwise).
            Either way ``instrument/step`` can serve as the x axis
            (``wandb.define_metric("time/*", step_metric="instrument/step")``).
        commit: Passed to ``run.log``. With ``step="report"``, ``None`` leaves the row open
            until a later step is logged (your own metrics for that step join it), and
            ``True`` commits it at once.
        top: How many regions below the top level get keys in each report (those with the
            most time; default 10); ``None`` logs every region.
        init_kwargs: Arguments for ``wandb.init`` (``project=``, ``mode="offline"``, ...).

    Distributed: construct it on every rank; it calls no collective. Only the ranks in
    ``only_ranks`` log (and, with ``init_kwargs``, start a run).

    Example:
        >>> wandb.init(project="my-project")
        >>> reporter = instrument.Reporter(every=50, sinks=[instrument.sinks.WandB()])
    """

    def __init__(
        self,
        run: Any = None,
        *,
        only_ranks: RankFilter = 0,
        ranks: RankFilter | None = None,
        prefix: str = "",
        step: str = "report",
        commit: bool | None = None,
        top: int | None = TOP,
        **init_kwargs: Any,
    ) -> None:
        if run is not None and not callable(getattr(run, "log", None)):
            raise TypeError(f"WandB run must be a wandb run (with log()), got {run!r}")
        if not isinstance(prefix, str):
            raise TypeError(f"WandB prefix must be a str, got {prefix!r}")
        if step not in STEP_MODES:
            raise ValueError(f"unknown step {step!r}; expected one of 'report', 'run'")
        if commit is not None and not isinstance(commit, bool):
            raise TypeError(f"WandB commit must be True, False or None, got {commit!r}")
        self.only_ranks = only_ranks_option(only_ranks, ranks)
        self.top = check_top(top)
        self._wandb: Any = None
        if run is None:  # imported now, never in a flush (a fork during an import hangs)
            extras.require("wandb", INSTALL_HINT)
            self._wandb = extras.load("wandb", "wandb", INSTALL_HINT)
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self.step = step
        self.commit = commit
        self.init_kwargs = init_kwargs
        self._run = run
        self._owned = False  # True while self._run is a run this sink started
        self._told_behind = False
        self._lock = ForkSafeLock()

    def write(self, report: Report) -> None:
        prefix = self.prefix
        tags = scalars(report, self.top)
        values: dict[str, float | int] = {prefix + k: v for k, v in tags.items()}
        step = global_step(report)
        values[prefix + STEP_KEY] = step
        with self._lock:
            run = self._current_run()
            if self.step == "run":
                run.log(values, commit=False if self.commit is None else self.commit)
                return
            run_step = _next_step(run)
            if run_step is not None and step < run_step:  # wandb would drop it at step=
                self._tell_behind(run_step, step)
                run.log(values, commit=False)
                return
            run.log(values, step=step, commit=self.commit)

    def _current_run(self) -> Any:
        if self._run is not None:
            return self._run
        wandb = self._wandb
        if wandb.run is not None:
            return wandb.run
        if not self.init_kwargs:
            raise RuntimeError(
                "WandB sink has no wandb run: call wandb.init() before the first report, "
                "pass a run (WandB(run)), or pass wandb.init arguments "
                "(WandB(project='my-project')) for the sink to start one"
            )
        self._run = wandb.init(**self.init_kwargs)
        self._owned = True
        return self._run

    def _tell_behind(self, run_step: int, step: int) -> None:
        if self._told_behind:
            return
        self._told_behind = True
        logger.info(
            "instrument: the wandb run is at step %d, past this report's step %d; reports "
            "are logged into the run's current row instead (plot them against %r, or pass "
            "WandB(step='run')). Said once.",
            run_step,
            step,
            self.prefix + STEP_KEY,
        )

    def close(self) -> None:
        """Finish the run if this sink started it."""
        with self._lock:
            if self._owned and self._run is not None:
                run, self._run, self._owned = self._run, None, False
                run.finish()

    def __repr__(self) -> str:
        target = "wandb.run" if self._run is None else repr(self._run)
        return f"WandB({target}, prefix={self.prefix!r}, step={self.step!r})"
