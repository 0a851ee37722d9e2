"""MLflow: real runs in a real local tracking store, read back with ``MlflowClient``.

The fast tests use MLflow's file store (``file:`` URI, in maintenance mode upstream but
still served with ``MLFLOW_ALLOW_FILE_STORE=true``); a fresh sqlite store spends ~10 s on
its schema migrations, so its test is in the slow tier. mlflow itself takes seconds to
import: it is imported once, by the module's fixture, never at collection.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import instrument
from instrument.report import Node, Report
from instrument.sinks.memory import InMemory
from instrument.sinks.mlflow import MLflow, metric_name
from instrument.sinks.scalars import scalars
from instrument.stats import Stats
from instrument.testing import FakeClock

needs_mlflow = pytest.mark.skipif(
    importlib.util.find_spec("mlflow") is None,
    reason='needs mlflow: pip install "torch-instrument[mlflow]"',
)
HINT = re.escape('MLflow sink needs mlflow: pip install "torch-instrument[mlflow]"')
LONG = "block_" * 50  # a region name that makes metric names over MLflow's 250 characters
NAMES = ("forward", "layers.0", "(self)", ".", LONG)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A file tracking store for the module, as MLflow's tracking URI."""
    pytest.importorskip("mlflow")
    import mlflow

    uri = (tmp_path_factory.mktemp("mlruns") / "store").as_uri()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # no thread reaching out
        before = mlflow.get_tracking_uri()
        mlflow.set_tracking_uri(uri)
        yield uri
        mlflow.set_tracking_uri(before)


def client(uri: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def work(clock: FakeClock, forward: float, steps: int = 2) -> None:
    """Steps with a nested module-like path: ``step/forward/layers.0/(self)`` and more."""
    for _ in range(steps):
        with instrument.timed("step"), instrument.timed("forward"):
            clock.advance(forward)
            with instrument.timed("layers.0"):
                clock.advance(0.002)
                with instrument.timed("(self)"):
                    clock.advance(0.001)
            with instrument.timed("."), instrument.timed(LONG):
                clock.advance(0.003)
        instrument.step(samples=4)


def history(uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric of the run: name -> [(step, value), ...] in step order."""
    found = client(uri)
    names = found.get_run(run_id).data.metrics
    return {
        name: sorted((m.step, round(m.value, 6)) for m in found.get_metric_history(run_id, name))
        for name in names
    }


@needs_mlflow
def test_reports_read_back_at_their_steps_with_params_in_one_batch_each(
    store: str, clock: FakeClock
) -> None:
    sink = MLflow(experiment="reports", run_name="demo")
    calls: list[int] = []
    log_batch = sink._client.log_batch

    def counted(run_id: str, **kwargs: Any) -> None:  # the real call, counted
        calls.append(len(kwargs.get("metrics", ())))
        log_batch(run_id, **kwargs)

    sink._client.log_batch = counted
    memory = InMemory()
    reporter = instrument.Reporter(every=2, sinks=[sink, memory], warmup=0, memory=False)
    for forward in (0.010, 0.020):
        work(clock, forward)
    reporter.close()

    found = client(store)
    experiment = found.get_experiment_by_name("reports")
    (run,) = found.search_runs([experiment.experiment_id])
    assert run.info.run_name == "demo"
    assert run.info.status == "FINISHED"  # the sink created it, so it ended it
    assert run.data.params == {
        "instrument.version": instrument.__version__,
        "instrument.normalizer": "1.0",
        "instrument.ranks": "local",
        "instrument.world_size": "1",
        "instrument.clock": "cpu",
        "instrument.top": "10",
    }
    first, second = memory.reports
    assert calls == [0, len(scalars(first, 10)), len(scalars(second, 10))]  # params, 2 reports
    metrics = history(store, run.info.run_id)
    expected: dict[str, list[tuple[int, float]]] = {}
    for report in memory.reports:
        for tag, value in scalars(report, 10).items():
            expected.setdefault(metric_name(tag), []).append((report.step, round(value, 6)))
    assert metrics == expected
    assert metrics["time/step/forward/layers.0/self/mean_ms"] == [(2, 1.0), (4, 1.0)]
    assert metrics["time/step/forward/_./count"] == [(2, 2.0), (4, 2.0)]  # 2 steps each
    (long,) = (name for name in metrics if LONG[:40] in name and name.endswith("/mean_ms"))
    assert len(long) == 250
    assert metrics["time/step/forward/mean_ms"] == [(2, 16.0), (4, 26.0)]
    assert metrics["throughput/samples_per_sec"][0][0] == 2


@needs_mlflow
def test_the_active_run_or_the_given_one_is_used_and_never_ended(
    store: str, clock: FakeClock
) -> None:
    import mlflow

    with mlflow.start_run() as active:
        reporter = instrument.Reporter(every=2, sinks=[MLflow()], memory=False)
        work(clock, 0.010)
        reporter.close()
        assert client(store).get_run(active.info.run_id).info.status == "RUNNING"
        assert mlflow.active_run() is not None
    given = client(store).create_run(active.info.experiment_id).info.run_id
    reporter = instrument.Reporter(every=2, sinks=[MLflow(run_id=given, prefix="perf")])
    work(clock, 0.030)
    reporter.close()
    assert client(store).get_run(given).info.status == "RUNNING"
    assert history(store, active.info.run_id)["time/step/forward/mean_ms"] == [(2, 16.0)]
    assert history(store, given)["perf/time/step/forward/mean_ms"] == [(2, 36.0)]
    assert client(store).get_run(given).data.params["perf/instrument.top"] == "10"


@needs_mlflow
def test_a_broken_store_is_reported_once_and_training_goes_on(
    store: str, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "file").write_text("not a directory")
    broken = MLflow(tracking_uri=(tmp_path / "file" / "store").as_uri())  # under a file
    memory = InMemory()
    with caplog.at_level(logging.ERROR, logger="instrument"):
        reporter = instrument.Reporter(every=2, sinks=[broken, memory], memory=False)
        for forward in (0.010, 0.020, 0.030):
            work(clock, forward)
        reporter.close()
    assert len(memory.reports) == 3
    (record,) = [r for r in caplog.records if r.name == "instrument"]
    assert "failed and was skipped" in record.getMessage()
    assert "MLflow" in record.getMessage()


@needs_mlflow
def test_a_run_with_other_params_keeps_them_and_still_gets_the_metrics(
    store: str, caplog: pytest.LogCaptureFixture
) -> None:
    host = Stats(1, 0.5, 0.5, 0.5, 0.5, 0.0, 0.5, 0.5, 0.5)
    run_id = client(store).create_run("0").info.run_id
    client(store).log_param(run_id, "instrument.top", "3")
    with caplog.at_level(logging.WARNING, logger="instrument"):
        MLflow(run_id=run_id).write(Report(nodes=(Node(path="x", host=host),), index=1))
    (record,) = caplog.records
    assert "did not take instrument's params" in record.getMessage()
    assert client(store).get_run(run_id).data.params["instrument.top"] == "3"
    assert history(store, run_id)["time/x/mean_ms"] == [(1, 500.0)]


@needs_mlflow
def test_several_ranks_keep_apart_and_the_filter_holds(store: str) -> None:
    host = Stats(1, 0.5, 0.5, 0.5, 0.5, 0.0, 0.5, 0.5, 0.5)
    run_id = client(store).create_run("0").info.run_id
    sink = MLflow(run_id=run_id, only_ranks="all")
    for rank in (0, 1):
        sink.write(Report(nodes=(Node(path="x", host=host),), index=1, rank=rank, world_size=2))
    metrics = history(store, run_id)
    assert metrics["rank0/time/x/mean_ms"] == metrics["rank1/time/x/mean_ms"] == [(1, 500.0)]
    assert MLflow(run_id=run_id).wants(0)
    assert not MLflow(run_id=run_id).wants(1)
    assert repr(sink) == f"MLflow({run_id}, tracking_uri={store!r})"


@needs_mlflow
def test_mlflow_is_imported_when_the_sink_is_made_never_at_a_report(store: str) -> None:
    host = Stats(1, 0.5, 0.5, 0.5, 0.5, 0.0, 0.5, 0.5, 0.5)
    sink = MLflow(experiment="imports")
    before = set(sys.modules)
    sink.write(Report(nodes=(Node(path="x", host=host),), index=1))
    sink.close()
    assert set(sys.modules) - before == set()


@pytest.mark.parametrize(
    ("tag", "name"),
    [
        ("time/step/forward/mean_ms", "time/step/forward/mean_ms"),
        ("time/a/./b/count", "time/a/_./b/count"),
        ("time/../count", "time/_../count"),
        ("time/a.b..c/count", "time/a.b..c/count"),
    ],
)
def test_metric_name(tag: str, name: str) -> None:
    assert metric_name(tag) == name


def test_a_long_name_keeps_its_start_and_statistic_and_stays_apart() -> None:
    one, two = (metric_name(f"time/{'x' * 300}{end}/mean_ms") for end in "12")
    assert len(one) == len(two) == 250
    assert one.startswith("time/xxx")
    assert one.endswith("/mean_ms")
    assert one != two
    assert metric_name(f"time/{'x' * 300}1/mean_ms") == one  # the same in every report


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"run_id": ""}, TypeError, "run_id must be a non-empty str or None, got ''"),
        ({"tracking_uri": 3}, TypeError, "tracking_uri must be a non-empty str"),
        ({"experiment": 3}, TypeError, "experiment must be a non-empty str"),
        ({"prefix": 3}, TypeError, "prefix must be a str, got 3"),
        ({"ranks": -1}, ValueError, "unknown ranks -1"),
        ({"top": -1}, ValueError, "top must be an int >= 0"),
    ],
)
def test_bad_arguments_are_refused(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        MLflow(**kwargs)


def test_missing_mlflow_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError, match=HINT) as caught:
        MLflow()
    assert caught.value.name == "mlflow"


@needs_mlflow
@pytest.mark.slow
def test_a_sqlite_store_gets_the_reports(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    pytest.importorskip("sqlalchemy")
    pytest.importorskip("alembic")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    memory = InMemory()
    reporter = instrument.Reporter(
        every=2, sinks=[MLflow(tracking_uri=uri, experiment="sqlite"), memory], memory=False
    )
    work(clock, 0.010, steps=4)
    reporter.close()
    found = client(uri)
    (run,) = found.search_runs([found.get_experiment_by_name("sqlite").experiment_id])
    assert run.info.status == "FINISHED"
    assert history(uri, run.info.run_id)["time/step/forward/mean_ms"] == [(2, 16.0), (4, 16.0)]
    assert run.data.params["instrument.clock"] == "cpu"
