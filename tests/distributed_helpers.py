"""Run a function on N real processes joined in a gloo group on 127.0.0.1.

Example:
    >>> def worker(rank: int, world_size: int, scale: int) -> int:
    ...     t = torch.tensor([rank * scale])
    ...     dist.all_reduce(t)
    ...     return int(t)
    >>> run_ranks(worker, 2, 10)
    [10, 10]

The function must live at module level (spawned processes import it by name); its
arguments and return value must pickle.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Collection
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

#: How long a rank waits for its peers inside a collective before giving up.
GROUP_TIMEOUT = timedelta(seconds=60)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _entry(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    args: tuple[Any, ...],
    results: Any,
    backend: str = "gloo",
) -> None:
    """One rank: join the group, run ``fn``, send back ``(rank, ok, value or traceback)``."""
    try:
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=GROUP_TIMEOUT,
        )
        try:
            value = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, value))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 90.0,
    dead: Collection[int] = (),
    backend: str = "gloo",
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned processes in one group
    (gloo, or ``backend``) and return each rank's return value, in rank order.

    Raises ``RuntimeError`` with the failing ranks' tracebacks, or naming the ranks that did
    not answer within ``timeout`` seconds (those are killed). Ranks in ``dead`` are expected
    to die without answering (a crash under test): their value is ``None``.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_entry,
            args=(fn, rank, world_size, port, args, results, backend),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    answers: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        while any(rank not in answers for rank in range(world_size) if rank not in dead):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, ok, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                if not any(proc.is_alive() for proc in procs) and results.empty():
                    break  # every process died without a word
                continue
            answers[rank] = (ok, value)
    finally:
        _stop(procs, deadline)
    for rank in dead:
        answers.setdefault(rank, (True, None))
    return _values(answers, [proc.exitcode for proc in procs], timeout)


#: What a launcher sets for its children; cleared for a launch from a test.
LAUNCHER_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def torchrun(
    script: Path, nprocs: int, *args: str, timeout: float = 170
) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.run`` of ``script`` on ``nprocs`` local ranks (gloo is
    the script's to choose), on a free port, with no launcher variables inherited."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nprocs}"]
    command += [f"--master-port={free_port()}", str(script), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def _stop(procs: list[Any], deadline: float) -> None:
    """Join every process until ``deadline`` (at least briefly), then kill stragglers."""
    for proc in procs:
        proc.join(timeout=max(deadline - time.monotonic(), 5.0))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5.0)


def _values(
    answers: dict[int, tuple[bool, Any]], exitcodes: list[int | None], timeout: float
) -> list[Any]:
    world_size = len(exitcodes)
    failed = {rank: value for rank, (ok, value) in answers.items() if not ok}
    if failed:
        details = "\n".join(f"--- rank {rank} ---\n{tb}" for rank, tb in sorted(failed.items()))
        raise RuntimeError(f"ranks {sorted(failed)} raised:\n{details}")
    missing = [rank for rank in range(world_size) if rank not in answers]
    if missing:
        codes = ", ".join(f"rank {rank}: exit code {exitcodes[rank]}" for rank in missing)
        raise RuntimeError(
            f"ranks {missing} did not answer within {timeout:g} s ({codes}; "
            "a negative code is the signal that killed it)"
        )
    return [answers[rank][1] for rank in range(world_size)]
