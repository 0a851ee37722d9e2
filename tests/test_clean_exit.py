"""A finished multi-rank job exits 0: nothing of ``instrument`` keeps a process group, its
store or gloo's worker threads alive past ``destroy_process_group()``.

A group kept alive that way is torn down during interpreter shutdown, where a gloo worker
thread that still has to free a tensor cannot take the GIL and aborts the process
(``terminate called without an active exception``, SIGABRT): a finished job reported as
failed. The default tier checks the cause on two ranks; the slow tier runs the whole job
many times, spawned and under torchrun, and requires every process to exit 0.
"""

from __future__ import annotations

import gc
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as tmp

import instrument
from instrument.testing import FakeClock, use_clock
from tests.distributed_helpers import GROUP_TIMEOUT, free_port, run_ranks, torchrun

MODES = ("minmax", "all")


def run_job(mode: str, close: bool = True) -> str:
    """The job: 8 steps of ``data`` and ``forward`` under a reporter every 4 steps, closed
    (or left to the flush at exit); the last report rendered."""
    got: list[Any] = []
    clock = FakeClock()
    with use_clock(clock):
        reporter = instrument.Reporter(
            every=4, ranks=mode, sinks=[got.append], memory=False, rank_timeout=60
        )
        for _ in range(8):
            with instrument.timed("data"):
                clock.advance(0.001)
            with instrument.timed("forward"):
                clock.advance(0.002)
            instrument.step()
        if close:
            reporter.close()
    return str(got[-1].render())


def released_worker(rank: int, world_size: int, port: int) -> dict[str, bool]:
    """Run the job in both modes, destroy the group, and say whether the old group and its
    store are gone; then join a new group (``run_ranks`` ends it) and run the job again."""
    for mode in MODES:
        run_job(mode)
    world = weakref.ref(dist.group.WORLD)
    store = weakref.ref(dist.distributed_c10d._get_default_store())
    dist.destroy_process_group()
    gc.collect()
    out = {"group_gone": world() is None, "store_gone": store() is None}
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=GROUP_TIMEOUT,
    )
    out["again"] = "forward" in run_job("minmax")
    return out


@pytest.mark.timeout(120)
def test_destroy_process_group_ends_the_group_and_its_store() -> None:
    """After both kinds of cross-rank flush, ``destroy_process_group()`` leaves no reference
    of ours to the group or its store (they were held by the flush's bookkeeping), and a new
    group afterwards is flushed across as well."""
    results = run_ranks(released_worker, 2, free_port())
    assert results == [{"group_gone": True, "store_gone": True, "again": True}] * 2


# -- the whole job, many times (slow tier) -------------------------------------------------


def spawned_worker(rank: int, port: int, mode: str, close: bool) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=GROUP_TIMEOUT,
    )
    run_job(mode, close)
    dist.destroy_process_group()


def spawn_job(mode: str, close: bool, timeout: float) -> str:
    """One spawned 2-rank job; "" when both processes exited 0, else what went wrong."""
    context = tmp.start_processes(
        spawned_worker,
        args=(free_port(), mode, close),
        nprocs=2,
        start_method="spawn",
        join=False,
    )
    deadline = time.monotonic() + timeout
    try:
        while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                return f"{mode}: not done in {timeout:g} s"
    except Exception as error:  # ProcessExitedException (a signal), ProcessRaisedException
        return f"{mode}: {error}"
    return ""


TORCHRUN_JOB = """
import sys
import torch.distributed as dist
sys.path.insert(0, {root!r})
from tests.test_clean_exit import MODES, run_job

dist.init_process_group("gloo")
for mode in MODES:
    run_job(mode)
dist.destroy_process_group()
"""

RUNS = 50


def pure_every_other_run(monkeypatch: pytest.MonkeyPatch, run: int) -> None:
    """Odd runs on the pure-Python path (``INSTRUMENT_NO_EXTENSIONS=1``), even ones on C."""
    if run % 2:
        monkeypatch.setenv("INSTRUMENT_NO_EXTENSIONS", "1")
    else:
        monkeypatch.delenv("INSTRUMENT_NO_EXTENSIONS", raising=False)


@pytest.mark.slow  # 50 spawned 2-rank jobs of both modes: about 6 minutes
@pytest.mark.timeout(1800)
def test_a_spawned_two_rank_job_exits_0_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job spawned twice from one parent (``minmax`` then ``all``), 50 times, every
    other time on the pure-Python path, and every other pair of runs without ``close()``
    (the reporter is closed by the flush at exit): every process exits 0."""
    failed = []
    for run in range(RUNS):
        pure_every_other_run(monkeypatch, run)
        close = run % 4 < 2
        for mode in MODES:
            if error := spawn_job(mode, close, 120):
                failed.append(f"run {run} (close={close}): {error}")
    assert not failed, "\n".join(failed)


@pytest.mark.slow  # 50 torchrun launches of a 2-rank job: about 6 minutes
@pytest.mark.timeout(1800)
def test_a_torchrun_two_rank_job_exits_0_every_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job under torchrun (both modes in one process group), 50 times, every other time
    on the pure-Python path: torchrun and every rank exit 0."""
    script = tmp_path / "job.py"
    script.write_text(TORCHRUN_JOB.format(root=str(Path(__file__).resolve().parent.parent)))
    failed = []
    for run in range(RUNS):
        pure_every_other_run(monkeypatch, run)
        done = torchrun(script, 2, timeout=120)
        if done.returncode != 0:
            failed.append(f"run {run}: exit {done.returncode}\n{done.stderr[-1500:]}")
    assert not failed, "\n".join(failed)
