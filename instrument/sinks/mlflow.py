"""MLflow: each report as one ``log_batch`` of metrics at the report's step."""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import time
from typing import Any

from instrument.lifecycle import ForkSafeLock
from instrument.report import Report
from instrument.sinks import extras
from instrument.sinks.base import RankFilter, Sink, only_ranks_option, single_rank
from instrument.sinks.scalars import TOP, check_top, global_step, scalars

logger = logging.getLogger("instrument")

INSTALL_HINT = 'MLflow sink needs mlflow: pip install "torch-instrument[mlflow]"'
#: MLflow's longest metric or param key.
MAX_KEY = 250


def metric_name(tag: str) -> str:
    """The MLflow metric name of a tag of :func:`~instrument.sinks.scalars.scalars`.

    Tags already hold only letters, digits, ``_ . -`` and ``/``, which MLflow accepts. Two
    more of MLflow's rules: a segment made of dots alone (a region named ``.``) would read
    as a file path, so it gets a ``_`` before it (``_.``); a name over 250 characters keeps
    its first characters and its last segment (the statistic) with 8 hex digits of its
    hash between them, the same for every report."""
    name = "/".join("_" + part if not part.strip(".") else part for part in tag.split("/"))
    if len(name) <= MAX_KEY:
        return name
    tail = "/" + name.rpartition("/")[2]
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    return name[: MAX_KEY - len(tail) - 9] + "-" + digest + tail


def _version() -> str:
    try:
        return importlib.metadata.version("torch-instrument")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _check_text(name: str, value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise TypeError(f"MLflow {name} must be a non-empty str or None, got {value!r}")
    return value


class MLflow(Sink):
    """Log each report to an MLflow run: the tags of :func:`instrument.sinks.scalars.scalars`
    (``time/<path>/mean_ms``, ``throughput/tokens_per_sec``, ``diagnosis/<kind>``...) as
    metrics at the report's step (the steps seen so far, or the report's index when no
    step was marked), all of one report in one ``MlflowClient.log_batch`` call. Names go
    through :func:`metric_name`. Regions get metrics for the top level and the ``top``
    deeper regions with the most time.

    The run is ``run_id`` if given, else the active run (``mlflow.active_run()``) at each
    report, else one the sink creates on its first report (in ``experiment``) and ends in
    :meth:`close`. It never ends a run it did not create. On the first report to a run it
    logs instrument's configuration as params (``instrument.version``, ``.normalizer``,
    ``.ranks``, ``.world_size``, ``.clock``, ``.top``); a run that already holds another
    value for one keeps its own (MLflow params never change), and a warning says so. A
    store that cannot be opened or written fails the report (the reporter logs it once);
    the next report tries again.

    Args:
        run_id: The run to log to.
        tracking_uri: The tracking server or store (``"sqlite:///mlflow.db"``,
            ``"http://host:5000"``); default: MLflow's tracking URI when the sink is made.
            The active run is used only when this is MLflow's tracking URI.
        experiment: The experiment (by name, created if missing) of a run the sink
            creates; default: ``MLFLOW_EXPERIMENT_NAME``, ``MLFLOW_EXPERIMENT_ID``, else
            MLflow's default experiment.
        run_name: The name of a run the sink creates.
        only_ranks: Which ranks log: rank 0 by default (one run per job), "all", a rank, or a
            collection of ranks.
        prefix: Put before every metric name (``"perf"`` gives ``perf/time/...``).
        top: How many regions below the top level get metrics in each report (those with
            the most time; default 10); ``None`` logs every region.

    Distributed: construct it on every rank; it calls no collective. Only the ranks in
    ``only_ranks`` log. When several ranks of a job log (``only_ranks="all"``), each rank's
    names get ``rank<R>/`` in front, so ranks sharing one run (``run_id=``) keep apart.

    Example:
        >>> with mlflow.start_run():
        ...     reporter = instrument.Reporter(every=50, sinks=[instrument.sinks.MLflow()])
    """

    def __init__(
        self,
        *,
        run_id: str | None = None,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        run_name: str | None = None,
        only_ranks: RankFilter = 0,
        ranks: RankFilter | None = None,
        prefix: str = "",
        top: int | None = TOP,
    ) -> None:
        self.run_id = _check_text("run_id", run_id)
        uri = _check_text("tracking_uri", tracking_uri)
        self.experiment = _check_text("experiment", experiment)
        self.run_name = _check_text("run_name", run_name)
        if not isinstance(prefix, str):
            raise TypeError(f"MLflow prefix must be a str, got {prefix!r}")
        self.only_ranks = only_ranks_option(only_ranks, ranks)
        self.top = check_top(top)
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        # imported now, never in a flush (a fork during an import hangs)
        extras.require("mlflow", INSTALL_HINT)
        self._mlflow: Any = extras.load("mlflow", "mlflow", INSTALL_HINT)
        entities = extras.load("mlflow.entities", "mlflow", INSTALL_HINT)
        self._metric: Any = entities.Metric
        self._param: Any = entities.Param
        fluent_uri = self._mlflow.get_tracking_uri()
        self.tracking_uri: str = uri or fluent_uri
        self._follows_active = self.tracking_uri == fluent_uri
        self._client: Any = None
        try:  # opens the store: its backend (sqlalchemy, requests...) is imported now
            self._open()
        except Exception:  # opened again at the next report, where the reporter logs it
            pass
        self._version = _version()
        self._created: str | None = None  # the run this sink created (ended at close)
        self._configured: set[str] = set()  # runs that have the params
        self._lock = ForkSafeLock()

    def _open(self) -> Any:
        """The client, made on first use (a store that failed to open is tried again)."""
        if self._client is None:
            self._client = self._mlflow.MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def write(self, report: Report) -> None:
        front = self.prefix
        if report.world_size > 1 and not single_rank(self.only_ranks):
            front += f"rank{report.rank}/"
        step = global_step(report)
        stamp = int((report.end_time or time.time()) * 1000)
        metric = self._metric
        metrics = [
            metric(metric_name(front + tag), value, stamp, step)
            for tag, value in scalars(report, self.top).items()
        ]
        with self._lock:
            client = self._open()
            run_id = self._run_id(client)
            if run_id not in self._configured:
                self._configured.add(run_id)
                self._log_params(client, run_id, report)
            client.log_batch(run_id, metrics=metrics)

    def _run_id(self, client: Any) -> str:
        if self.run_id is not None:
            return self.run_id
        if self._created is not None:
            return self._created
        if self._follows_active:
            active = self._mlflow.active_run()
            if active is not None:
                return str(active.info.run_id)
        run = client.create_run(self._experiment_id(client), run_name=self.run_name)
        self._created = str(run.info.run_id)
        return self._created

    def _experiment_id(self, client: Any) -> str:
        name = self.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME")
        if not name:
            return os.environ.get("MLFLOW_EXPERIMENT_ID") or "0"
        found = client.get_experiment_by_name(name)
        if found is not None:
            return str(found.experiment_id)
        return str(client.create_experiment(name))

    def _log_params(self, client: Any, run_id: str, report: Report) -> None:
        """instrument's configuration as the run's params; a conflict is said once."""
        values = {
            "version": self._version,
            "normalizer": str(report.normalizer),
            "ranks": report.ranks,
            "world_size": str(report.world_size),
            "clock": ",".join(sorted({node.clock for node in report.nodes})) or "none",
            "top": str(self.top),
        }
        params = [self._param(f"{self.prefix}instrument.{k}", v) for k, v in values.items()]
        try:
            client.log_batch(run_id, params=params)
        except Exception as error:
            logger.warning(
                "instrument: MLflow run %s did not take instrument's params (%s); the "
                "metrics are logged without them",
                run_id,
                error,
            )

    def close(self) -> None:
        """End the run if this sink created it."""
        with self._lock:
            if self._created is not None:
                run_id, self._created = self._created, None
                self._open().set_terminated(run_id)

    def __repr__(self) -> str:
        target = self.run_id or ("active run" if self._follows_active else "new run")
        return f"MLflow({target}, tracking_uri={self.tracking_uri!r})"
