"""Stalls: a few steps many times longer than the median one, and how often they come."""

from __future__ import annotations

from instrument.diagnosis.rules import ms, pct
from instrument.diagnosis.thresholds import Thresholds
from instrument.diagnosis.view import View
from instrument.findings import Finding
from instrument.report import Node


def _excess(node: Node, steps: int) -> float:
    """How much ``node``'s longest call exceeds a usual one (all of it for a region that
    does not run every step, such as a save every 20 steps)."""
    if node.count == 0:
        return 0.0
    return node.max - node.p50 if node.count >= steps else node.max


class Stalls:
    """The stall rule, with the run's count of stalls so far (for their period)."""

    def __init__(self) -> None:
        self.stalls = 0  # estimated stalled steps in the intervals judged
        self.steps = 0  # steps of the intervals judged

    def check(self, v: View, t: Thresholds) -> Finding | None:
        """A finding when the interval's longest step is ``stall_ratio`` times the median
        and the stalls are ``stall_share`` of its time. The first interval of a run (its
        warm-up: first calls, lazy initialisation) is not judged, and ``instrument``'s own
        flush (with any wait for a missing rank) is taken out of the step that carried it
        first: it is never the user's stall."""
        step = v.report.step_time
        if step is None or not v.has_steps or v.warm_up:
            return None
        self.steps += v.steps
        per_call = v.per_call  # a step's figures (median, longest) -> seconds
        median = step.p50 * per_call
        flush = v.flush * v.steps  # seconds in the interval
        longest = max(step.max * per_call - flush, median)
        excess = longest - median
        if not _stall_shaped(median, longest, t):
            return None
        total = v.step * v.steps - flush
        lost = max(total - median * v.steps, 0.0)
        count = min(max(round(lost / excess), 1), v.steps)
        self.stalls += count  # every stall counts for the period, also a small one
        share = lost / total if total > 0 else 0.0
        if share < t.stall_share:
            return None
        where = self._where(v, excess / per_call)
        period = self.steps / self.stalls if self.stalls else 0.0
        often = f"about every {period:.0f} steps" if self.stalls > 1 else "once"
        why = (
            f"steps of up to {ms(longest)} against a median of {ms(median)}, {often} "
            f"({self.stalls} in {self.steps} steps), in {where}; they cost {pct(share)} of "
            "the interval"
        )
        severity = "warning"
        hint = (
            "find what runs on those steps (a checkpoint save, evaluation, logging, garbage "
            "collection): make it asynchronous or less frequent, or time it with "
            "instrument.timed to see it"
        )
        elsewhere = _scattered(v, where, t)
        if elsewhere is not None:  # slow calls all over the step: the machine, not a stall
            severity = "info"
            why += f", and slow calls elsewhere too ({elsewhere})"
            hint = (
                "slow calls in several regions are the machine's: look at other processes "
                "or threads on its cores, throttling and swapping"
            )
        elif _every_step_compute(v, where):  # one slow call of the step's own work
            severity = "info"
            hint = (
                f"a slow call of {where}, which runs every step: the machine (other processes "
                "or threads on its cores), garbage collection or a recompilation, not work "
                "of its own between steps"
            )
        return Finding(
            "stalls",
            severity,
            why,
            hint,
            path=where,
            evidence={
                "max_s": longest,
                "median_s": median,
                "stalls": self.stalls,
                "steps": self.steps,
                "period_steps": period,
                "share": share,
            },
        )

    @staticmethod
    def _where(v: View, excess: float) -> str:
        """The deepest region whose own longest call explains half the stall (``excess``,
        in the report's per-call unit), else the time in no region."""
        found = None
        for node in v.report.nodes:
            if node.concurrent or _excess(node, v.steps) < 0.5 * excess:
                continue
            if found is None or node.path.count("/") > found.path.count("/"):
                found = node
        return found.path if found is not None else v.other_path


def _stall_shaped(median: float, longest: float, t: Thresholds) -> bool:
    """A longest time (seconds) ``stall_ratio`` times the median and ``stall_min`` longer."""
    return longest >= t.stall_ratio * median and longest - median >= t.stall_min


def _scattered(v: View, where: str, t: Thresholds) -> str | None:
    """A region outside ``where``'s line (neither above nor below it) that runs every step
    and also has a call ``stall_ratio`` times its median and ``stall_min`` longer, or
    ``None``. One stall of the user's (a save, an evaluation) slows one place; a busy
    machine slows calls all over the step."""
    for node in v.report.nodes:
        path = node.path
        if node.concurrent or node.count < v.steps or path == where:
            continue
        if where.startswith(path + "/") or path.startswith(where + "/"):
            continue
        median, longest = node.p50 * v.per_call, node.max * v.per_call
        if _stall_shaped(median, longest, t):
            return f"{path} up to {ms(longest)} against a median of {ms(median)}"
    return None


def _every_step_compute(v: View, where: str) -> bool:
    """``where`` is, or is inside, a phase that runs every step other than ``data``: a
    slow call there is the step's own work slowed, not something run on some steps (a
    save, an evaluation: in no region, or a region of its own), nor the input pipeline."""
    phase = next((p for p in v.phases if where == p.path or where.startswith(p.path + "/")), None)
    if phase is None or phase.name == "data":
        return False
    node = v.report.get(where)
    return node is not None and node.count >= v.steps
