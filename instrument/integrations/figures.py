"""The numbers of a report for a trainer's own logs (HF ``log_history``, Lightning loggers).

Both integrations log the same keys, ``instrument/...``, so dashboards read alike.
"""

from __future__ import annotations

from instrument.report import Report
from instrument.sinks.scalars import scalars, tag_segment

LOG_MODES = ("compact", "all", "none")


def figures(report: Report, mode: str = "compact", depth: int = 1) -> dict[str, float]:
    """The numbers of ``report`` for a trainer's logs, keyed ``instrument/...``.

    "compact": per-step milliseconds of each region down to ``depth`` levels
    (``instrument/forward_ms``, ``instrument/optimizer_ms``), ``instrument/step_ms``,
    ``instrument/other_ms``, ``instrument/flush_ms`` (the report's ``flush_time``) and the
    known throughput rates. "all": every scalar the
    TensorBoard sink writes (:func:`instrument.sinks.scalars.scalars`).
    """
    if mode == "all":
        return {f"instrument/{tag}": value for tag, value in scalars(report).items()}
    out: dict[str, float] = {}
    for node in report.nodes:
        parts = node.path.split("/")
        if len(parts) <= depth and node.count:
            out[f"instrument/{'/'.join(tag_segment(p) for p in parts)}_ms"] = node.total * 1e3
    if report.step_time is not None:
        out["instrument/step_ms"] = report.step_time.mean * 1e3
        out["instrument/other_ms"] = (report.other or 0.0) * 1e3
        out["instrument/flush_ms"] = report.flush_time * 1e3
    rates = report.throughput
    if rates is not None:
        for name in ("samples_per_sec", "tokens_per_sec", "tflops", "mfu"):
            value = getattr(rates, name)
            if value is not None:
                out[f"instrument/{name}"] = float(value)
    return out
