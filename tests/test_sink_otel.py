"""OpenTelemetry: the real metrics SDK read back with ``InMemoryMetricReader``, and the real
OTLP/HTTP exporter sending to a receiver on 127.0.0.1 that decodes the protobuf requests."""

from __future__ import annotations

import importlib.util
import logging
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import instrument
from instrument.findings import KINDS
from instrument.report import Node, Report
from instrument.sinks.memory import InMemory
from instrument.sinks.otel import BUCKETS, OpenTelemetry
from instrument.stats import Stats
from instrument.testing import FakeClock

needs_sdk = pytest.mark.skipif(
    importlib.util.find_spec("opentelemetry.sdk") is None,
    reason='needs opentelemetry-sdk: pip install "torch-instrument[otel]"',
)
needs_exporter = pytest.mark.skipif(
    importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is None,
    reason='needs opentelemetry-exporter-otlp-proto-http: pip install "torch-instrument[otel]"',
)
HINT = re.escape('OpenTelemetry sink needs opentelemetry-sdk: pip install "torch-instrument[otel]"')
HOST = socket.gethostname()
Points = dict[str, list[tuple[dict[str, Any], Any]]]


def work(clock: FakeClock, forward: float, steps: int = 2) -> None:
    for _ in range(steps):
        with instrument.timed("step"):
            clock.advance(0.001)
            with instrument.timed("forward"):
                clock.advance(forward)
                with instrument.timed("layers.0"), instrument.timed("(self)"):
                    clock.advance(0.002)
        clock.advance(0.004)
        instrument.step(samples=4, tokens=64)


def in_memory() -> tuple[Any, Any]:
    """A real SDK meter provider and the reader that collects from it."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    return MeterProvider(metric_readers=[reader]), reader


def collect(reader: Any) -> tuple[Points, dict[str, str]]:
    """Every data point by metric name (attributes, value or histogram), and the units."""
    points: Points = {}
    units = {}
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "instrument"
            for metric in scope.metrics:
                units[metric.name] = metric.unit
                points[metric.name] = [
                    (dict(p.attributes), p if hasattr(p, "bucket_counts") else p.value)
                    for p in metric.data.data_points
                ]
    return points, units


@needs_sdk
def test_regions_step_time_throughput_and_diagnosis_are_recorded_with_rank_and_host(
    clock: FakeClock,
) -> None:
    provider, reader = in_memory()
    memory = InMemory()
    sinks = [OpenTelemetry(meter_provider=provider), memory]
    reporter = instrument.Reporter(every=2, sinks=sinks, warmup=0, memory=False)
    for forward in (0.010, 0.030):
        work(clock, forward)
    reporter.close()
    points, units = collect(reader)
    base = {"rank": 0, "host": HOST}

    duration = {attrs["region"]: point for attrs, point in points["instrument.region.duration"]}
    assert set(duration) == {"step", "step/forward", "step/forward/layers.0/(self)"} | {
        "step/forward/layers.0"
    }
    forward = duration["step/forward"]
    assert forward.count == 2  # one record per report: the mean per call
    assert forward.sum == pytest.approx(0.012 + 0.032)
    assert tuple(forward.explicit_bounds) == BUCKETS
    assert sum(forward.bucket_counts) == 2
    for attrs, _ in points["instrument.region.duration"]:
        assert attrs == {**base, "region": attrs["region"]}
    last = memory.reports[-1]
    region_time = {attrs["region"]: value for attrs, value in points["instrument.region.time"]}
    assert region_time["step/forward"] == pytest.approx(last["step/forward"].total)
    ((attrs, step),) = points["instrument.step.duration"]
    assert attrs == base
    assert step == pytest.approx(last.step_time.mean)
    ((_, samples),) = points["instrument.throughput.samples_per_sec"]
    assert samples == pytest.approx(last.throughput.samples_per_sec)
    ((_, flush),) = points["instrument.flush.duration"]
    assert flush == pytest.approx(last.self_cost.flush_seconds)
    diagnosis = {attrs["kind"]: value for attrs, value in points["instrument.diagnosis"]}
    assert set(diagnosis) == {*KINDS, "verdict"}
    assert diagnosis["verdict"] >= 1
    assert units["instrument.region.duration"] == units["instrument.step.duration"] == "s"
    assert units["instrument.throughput.tokens_per_sec"] == "{token}/s"
    assert units["instrument.diagnosis"] == "1"


@needs_sdk
def test_memory_in_bytes_and_events_and_the_rank_of_the_report() -> None:
    provider, reader = in_memory()
    memory = {"host_rss": 3 * 2**30, "device_ooms": 1}
    OpenTelemetry(meter_provider=provider, only_ranks=1).write(
        Report(index=1, rank=1, world_size=2, memory=memory)
    )
    points, units = collect(reader)
    assert points["instrument.memory.usage"] == [
        ({"rank": 1, "host": HOST, "memory": "host_rss"}, 3 * 2**30)
    ]
    assert points["instrument.memory.events"] == [
        ({"rank": 1, "host": HOST, "memory": "device_ooms"}, 1)
    ]
    assert units["instrument.memory.usage"] == "By"


@needs_sdk
def test_top_bounds_the_regions_recorded() -> None:
    host = Stats(1, 0.5, 0.5, 0.5, 0.5, 0.0, 0.5, 0.5, 0.5)
    paths = ("a", *(f"a/{i}" for i in range(15)))
    report = Report(nodes=tuple(Node(path=p, host=host) for p in paths), index=1)
    for top, expected in ((None, 16), (3, 4), (10, 11)):
        provider, reader = in_memory()
        OpenTelemetry(meter_provider=provider, top=top).write(report)
        points, _ = collect(reader)
        assert len(points["instrument.region.duration"]) == expected


class Receiver:
    """An OTLP/HTTP metrics receiver on 127.0.0.1: decodes each request's protobuf."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

        requests: list[Any] = []
        headers: list[dict[str, str]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = metrics_service_pb2.ExportMetricsServiceRequest()
                request.ParseFromString(body)
                requests.append(request)
                headers.append({k.lower(): v for k, v in self.headers.items()})
                reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:  # quiet
                pass

        self.requests = requests
        self.headers = headers
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.timeout = 1.0
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1/metrics"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def metrics(self) -> dict[str, list[Any]]:
        """Metric name -> every data point received, in order."""
        found: dict[str, list[Any]] = {}
        for request in self.requests:
            for resource in request.resource_metrics:
                for scope in resource.scope_metrics:
                    for metric in scope.metrics:
                        data = getattr(metric, metric.WhichOneof("data"))
                        found.setdefault(metric.name, []).extend(data.data_points)
        return found


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    pytest.importorskip("opentelemetry.proto")
    served = Receiver()
    served.thread.start()
    yield served
    served.server.shutdown()
    served.server.server_close()
    served.thread.join(timeout=5)


def attributes(point: Any) -> dict[str, Any]:
    out = {}
    for item in point.attributes:
        value = item.value
        out[item.key] = getattr(value, value.WhichOneof("value"))
    return out


@needs_exporter
@pytest.mark.timeout(30)
def test_the_otlp_http_exporter_sends_every_metric_to_the_endpoint(
    receiver: Receiver, clock: FakeClock
) -> None:
    sink = OpenTelemetry(endpoint=receiver.url, headers={"x-team": "perf"}, timeout=5.0)
    reporter = instrument.Reporter(every=2, sinks=[sink], warmup=0, memory=False)
    work(clock, 0.010, steps=4)
    reporter.close()  # shuts the sink's provider down: one last export
    found = receiver.metrics()
    assert receiver.headers[0]["x-team"] == "perf"
    assert receiver.headers[0]["content-type"] == "application/x-protobuf"
    assert {
        "instrument.region.duration",
        "instrument.region.time",
        "instrument.step.duration",
        "instrument.throughput.steps_per_sec",
        "instrument.throughput.samples_per_sec",
        "instrument.throughput.tokens_per_sec",
        "instrument.flush.duration",
        "instrument.diagnosis",
    } <= set(found)
    by_region = {attributes(p)["region"]: p for p in found["instrument.region.duration"]}
    forward = by_region["step/forward"]
    assert attributes(forward) == {"rank": 0, "host": HOST, "region": "step/forward"}
    assert forward.count == 2  # two reports
    assert forward.sum == pytest.approx(2 * 0.012)
    ((step),) = found["instrument.step.duration"]
    assert step.as_double == pytest.approx(0.017)
    assert attributes(step) == {"rank": 0, "host": HOST}


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@needs_exporter
@pytest.mark.timeout(30)
def test_an_unreachable_endpoint_is_reported_once_and_training_goes_on(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1/metrics"
    sink = OpenTelemetry(endpoint=url, timeout=0.5)
    memory = InMemory()
    start = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="instrument"):
        reporter = instrument.Reporter(every=2, sinks=[sink, memory], memory=False)
        work(clock, 0.010)
        sink.flush()  # an export now: it fails
        work(clock, 0.010, steps=4)  # the next report says so, once
        reporter.close()  # the last export fails too, within the timeout
    assert time.monotonic() - start < 10
    assert len(memory.reports) == 3
    (record,) = [r for r in caplog.records if r.name == "instrument"]
    assert "failed and was skipped" in record.getMessage()
    assert record.exc_info is not None
    assert f"OpenTelemetry export to {url} failed" in str(record.exc_info[1])


@needs_exporter
@pytest.mark.timeout(30)
def test_opentelemetry_is_imported_when_the_sink_is_made_never_at_a_report(
    receiver: Receiver,
) -> None:
    host = Stats(1, 0.5, 0.5, 0.5, 0.5, 0.0, 0.5, 0.5, 0.5)
    sink = OpenTelemetry(endpoint=receiver.url, timeout=5.0)
    before = set(sys.modules)
    sink.write(Report(nodes=(Node(path="x", host=host),), index=1))
    sink.close()  # the export, too
    assert receiver.metrics()["instrument.region.duration"]
    assert set(sys.modules) - before == set()


@needs_sdk
def test_the_global_provider_is_the_default() -> None:
    from opentelemetry import metrics

    assert OpenTelemetry().meter_provider is metrics.get_meter_provider()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"meter_provider": object()}, TypeError, "meter_provider must have get_meter()"),
        ({"endpoint": ""}, TypeError, "endpoint must be a URL string, got ''"),
        ({"endpoint": "http://x", "meter_provider": object()}, ValueError, "not both"),
        ({"headers": {"a": 1}}, TypeError, "headers must map str to str"),
        ({"timeout": 0}, ValueError, "timeout must be > 0 seconds, got 0"),
        ({"export_interval": "1"}, TypeError, "export_interval must be a number of seconds"),
        ({"ranks": -1}, ValueError, "unknown ranks -1"),
        ({"top": -1}, ValueError, "top must be an int >= 0"),
    ],
)
def test_bad_arguments_are_refused(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        OpenTelemetry(**kwargs)


def test_missing_opentelemetry_names_the_extra_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError, match=HINT) as caught:
        OpenTelemetry()
    assert caught.value.name == "opentelemetry"


@pytest.mark.slow  # a subprocess importing torch
def test_importing_instrument_imports_no_tracker_library() -> None:
    code = (
        "import sys, instrument, instrument.sinks\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'mlflow', 'opentelemetry'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"
