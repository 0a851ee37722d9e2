"""OpenTelemetry: each report as metric records (histograms and gauges) of an OTel meter."""

from __future__ import annotations

import importlib.metadata
import numbers
import socket
from collections.abc import Mapping
from typing import Any

from instrument.lifecycle import ForkSafeLock
from instrument.report import Report
from instrument.sinks import extras
from instrument.sinks.base import RankFilter, Sink, only_ranks_option
from instrument.sinks.scalars import (
    MEMORY_COUNTS,
    THROUGHPUT_FIELDS,
    TOP,
    check_top,
    diagnosis_levels,
    tagged_paths,
)

INSTALL_HINT = 'OpenTelemetry sink needs opentelemetry-sdk: pip install "torch-instrument[otel]"'
EXPORTER_HINT = (
    "OpenTelemetry sink with endpoint= needs opentelemetry-exporter-otlp-proto-http: "
    'pip install "torch-instrument[otel]"'
)
#: Bucket bounds (seconds) of the region histogram: 100 µs to 1 min.
BUCKETS: tuple[float, ...] = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
BUCKETS += (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
THROUGHPUT_UNITS = {
    "steps_per_sec": "{step}/s",
    "samples_per_sec": "{sample}/s",
    "tokens_per_sec": "{token}/s",
    "tflops": "TFLOP/s",
    "mfu": "1",
}


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"OpenTelemetry {name} must be a number of seconds, got {value!r}")
    if not 0 < float(value) < float("inf"):
        raise ValueError(f"OpenTelemetry {name} must be > 0 seconds, got {value!r}")
    return float(value)


def _version() -> str:
    try:
        return importlib.metadata.version("torch-instrument")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _watched(exporter_type: Any, failures: list[str]) -> Any:
    """``exporter_type`` that notes each failed export in ``failures``."""

    class Watched(exporter_type):  # type: ignore[misc]
        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
            result = super().export(metrics_data, timeout_millis, **kwargs)
            if getattr(result, "name", "SUCCESS") != "SUCCESS":
                failures.append(str(getattr(result, "name", result)))
            return result

    return Watched


class OpenTelemetry(Sink):
    """Record each report through an OpenTelemetry meter, with ``rank`` and ``host``
    attributes on every point:

    - ``instrument.region.duration`` (histogram, s; attribute ``region``, the region's
      path as in the report): the region's mean time per call in the interval, one record
      per report, for the top-level regions and the ``top`` deeper ones with the most time.
    - ``instrument.region.time`` (gauge, s; ``region``): the region's total time in the
      interval, as the report states it (per step with ``normalizer="steps"``).
    - ``instrument.step.duration`` (gauge, s): the mean step time, when steps were marked.
    - ``instrument.throughput.<field>`` (gauges): ``steps_per_sec``, ``samples_per_sec``,
      ``tokens_per_sec``, ``tflops``, ``mfu``, those that are known.
    - ``instrument.memory.usage`` (gauge, By; attribute ``memory``, the key of
      ``report.memory``) and ``instrument.memory.events`` (allocator retries, OOMs).
    - ``instrument.flush.duration`` (gauge, s): the previous flush's own time.
    - ``instrument.diagnosis`` (gauge; attribute ``kind``): for each finding kind and for
      ``verdict``, 0 absent, 1 info, 2 warning, 3 critical, when the report was diagnosed.

    Args:
        meter_provider: The ``MeterProvider`` to record through; default: OpenTelemetry's
            global one (set by your application, or by ``opentelemetry-instrument``; until
            one is set, OpenTelemetry drops the records), or with ``endpoint`` one the sink
            creates.
        endpoint: An OTLP/HTTP metrics URL (``"http://localhost:4318/v1/metrics"``): the
            sink creates a ``MeterProvider`` exporting there every ``export_interval``
            seconds from a background thread, and shuts it down in :meth:`close` (one
            last export). Give at most one of ``meter_provider`` and ``endpoint``.
        headers: HTTP headers for the created exporter (``{"authorization": "..."}``).
        export_interval: Seconds between exports of the created provider (default 60).
        timeout: Seconds one export (and :meth:`flush` / :meth:`close`) may take at most.
        only_ranks: Which ranks record: every rank by default (each rank is its own series,
            told apart by its ``rank`` attribute), a rank, or a collection of ranks.
        top: How many regions below the top level get points in each report (default
            10); ``None``: every region.

    A failed export of the created provider (a collector that is down) is raised at the
    next report, after that report is recorded: the reporter logs it once and training
    goes on, and the next export sends the cumulative values again.

    Distributed: construct it on every rank; it calls no collective.

    Example:
        >>> sink = instrument.sinks.OpenTelemetry(endpoint="http://localhost:4318/v1/metrics")
        >>> reporter = instrument.Reporter(every=50, sinks=[sink])
    """

    def __init__(
        self,
        *,
        meter_provider: Any = None,
        endpoint: str | None = None,
        headers: Mapping[str, str] | None = None,
        export_interval: float = 60.0,
        timeout: float = 10.0,
        only_ranks: RankFilter = "all",
        ranks: RankFilter | None = None,
        top: int | None = TOP,
    ) -> None:
        if meter_provider is not None and endpoint is not None:
            raise ValueError("OpenTelemetry takes meter_provider or endpoint, not both")
        if meter_provider is not None and not callable(getattr(meter_provider, "get_meter", None)):
            raise TypeError(
                f"OpenTelemetry meter_provider must have get_meter(), got {meter_provider!r}"
            )
        if endpoint is not None and (not isinstance(endpoint, str) or not endpoint):
            raise TypeError(f"OpenTelemetry endpoint must be a URL string, got {endpoint!r}")
        if headers is not None and not (
            isinstance(headers, Mapping)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
        ):
            raise TypeError(f"OpenTelemetry headers must map str to str, got {headers!r}")
        self.endpoint = endpoint
        self.export_interval = _seconds("export_interval", export_interval)
        self.timeout = _seconds("timeout", timeout)
        self.only_ranks = only_ranks_option(only_ranks, ranks)
        self.top = check_top(top)
        self.host = socket.gethostname()
        self._failures: list[str] = []
        self._reported = 0  # failures already raised
        self._owned = endpoint is not None
        # imported now, never in a flush (a fork during an import hangs)
        extras.require("opentelemetry", INSTALL_HINT)
        if endpoint is not None:
            meter_provider = self._create_provider(endpoint, dict(headers or {}))
        elif meter_provider is None:
            meter_provider = extras.load(
                "opentelemetry.metrics", "opentelemetry", INSTALL_HINT
            ).get_meter_provider()
        self.meter_provider = meter_provider
        self._lock = ForkSafeLock()
        self._make_instruments(meter_provider.get_meter("instrument", _version()))

    def _create_provider(self, endpoint: str, headers: dict[str, str]) -> Any:
        extras.require("opentelemetry.sdk", INSTALL_HINT)
        sdk = extras.load("opentelemetry.sdk.metrics", "opentelemetry-sdk", INSTALL_HINT)
        export = extras.load("opentelemetry.sdk.metrics.export", "opentelemetry-sdk", INSTALL_HINT)
        http = extras.load(
            "opentelemetry.exporter.otlp.proto.http.metric_exporter",
            "opentelemetry-exporter-otlp-proto-http",
            EXPORTER_HINT,
        )
        exporter = _watched(http.OTLPMetricExporter, self._failures)(
            endpoint=endpoint, headers=headers, timeout=self.timeout
        )
        reader = export.PeriodicExportingMetricReader(
            exporter,
            export_interval_millis=self.export_interval * 1000,
            export_timeout_millis=self.timeout * 1000,
        )
        # shut down by close(), which the reporter calls at exit after its last flush
        return sdk.MeterProvider(metric_readers=[reader], shutdown_on_exit=False)

    def _make_instruments(self, meter: Any) -> None:
        self._duration = meter.create_histogram(
            "instrument.region.duration",
            unit="s",
            description="A region's mean time per call in one report's interval",
            explicit_bucket_boundaries_advisory=BUCKETS,
        )
        self._region_time = meter.create_gauge(
            "instrument.region.time",
            unit="s",
            description="A region's total time in the interval, as the report states it",
        )
        self._step = meter.create_gauge(
            "instrument.step.duration", unit="s", description="The mean step time"
        )
        self._throughput = {
            name: meter.create_gauge(f"instrument.throughput.{name}", unit=unit)
            for name, unit in THROUGHPUT_UNITS.items()
        }
        self._memory = meter.create_gauge(
            "instrument.memory.usage", unit="By", description="Host and device memory"
        )
        self._memory_events = meter.create_gauge(
            "instrument.memory.events", unit="{event}", description="Allocator retries, OOMs"
        )
        self._flush = meter.create_gauge(
            "instrument.flush.duration", unit="s", description="The previous flush's own time"
        )
        self._diagnosis = meter.create_gauge(
            "instrument.diagnosis",
            unit="1",
            description="Per finding kind: 0 absent, 1 info, 2 warning, 3 critical",
        )

    def write(self, report: Report) -> None:
        base = {"rank": report.rank, "host": self.host}
        kept = tagged_paths(report, self.top)
        with self._lock:
            for node in report.nodes:
                if node.count and (kept is None or node.path in kept):
                    where = {**base, "region": node.path}
                    self._duration.record(node.mean, where)
                    self._region_time.set(node.total, where)
            if report.step_time is not None:
                self._step.set(report.step_time.mean, base)
            if report.throughput is not None:
                for name in THROUGHPUT_FIELDS:
                    value = getattr(report.throughput, name)
                    if value is not None:
                        self._throughput[name].set(float(value), base)
            for key, value in report.memory.items():
                gauge = self._memory_events if key in MEMORY_COUNTS else self._memory
                gauge.set(value, {**base, "memory": key})
            flush = report.self_cost.flush_seconds if report.self_cost else report.flush_time
            self._flush.set(flush, base)
            for kind, level in diagnosis_levels(report).items():
                self._diagnosis.set(level, {**base, "kind": kind})
            failed = self._failures[self._reported :]
            self._reported += len(failed)
        if failed:
            raise RuntimeError(
                f"OpenTelemetry export to {self.endpoint} failed {len(failed)} time(s) since "
                "the last report; the next export sends the cumulative values again"
            )

    def flush(self) -> None:
        """Export what was recorded now (a provider without ``force_flush``: nothing)."""
        force_flush = getattr(self.meter_provider, "force_flush", None)
        if callable(force_flush):
            force_flush(timeout_millis=self.timeout * 1000)

    def close(self) -> None:
        """Shut the created provider down (one last export); flush one passed in."""
        if self._owned:
            self._owned = False
            self.meter_provider.shutdown(timeout_millis=self.timeout * 1000)
        elif self.endpoint is None:
            self.flush()

    def __repr__(self) -> str:
        if self.endpoint is not None:
            return f"OpenTelemetry(endpoint={self.endpoint!r})"
        return f"OpenTelemetry(meter_provider={self.meter_provider!r})"
