"""instrument.distributed: barriers with a timeout, the metadata group and NeMo Automodel's
distributed helpers, on real gloo processes (no mock of torch.distributed)."""

from __future__ import annotations

import contextlib
import datetime
import io
import logging
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from distributed_helpers import GROUP_TIMEOUT, free_port, run_ranks
from torch import nn

from instrument.distributed.barrier import barrier_with_timeout, metadata_group
from instrument.distributed.helpers import (
    FirstRankPerNode,
    barrier_and_log,
    dp_eval_sample_shard,
    get_sync_ctx,
    log_rank_0,
    print_rank_0,
    reduce_loss,
)

TORCHRUN_ENV = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")


@contextlib.contextmanager
def captured_logs() -> Iterator[list[str]]:
    """The messages logged to the "instrument" logger inside the block, any level."""
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    log = logging.getLogger("instrument")
    handler, level = Keep(logging.DEBUG), log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield messages
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


# -- spawning processes with a setup of our own ---------------------------------------------


def _own_entry(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    backend: str | None,
    env: dict[str, str],
    results: Any,
) -> None:
    """One rank: set ``env``, join a group on ``backend`` (None: join none), run ``fn``."""
    try:
        os.environ.update(env)
        if backend is not None:
            dist.init_process_group(
                backend,
                init_method=f"tcp://127.0.0.1:{port}",
                rank=rank,
                world_size=world_size,
                timeout=GROUP_TIMEOUT,
            )
        value = fn(rank, world_size)
        if dist.is_initialized():
            dist.destroy_process_group()
        results.put((rank, True, value))
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def spawn(
    fn: Callable[[int, int], Any],
    world_size: int,
    *,
    backend: str | None = "gloo",
    env: Callable[[int, int], dict[str, str]] | None = None,
    timeout: float = 60.0,
) -> list[tuple[str, Any]]:
    """Run ``fn(rank, world_size)`` on spawned processes; each rank's ``("ok", value)``,
    ``("raised", traceback)`` or ``("exit", exit code)``. Stragglers past ``timeout`` are
    killed (exit code -9): nothing here can hang the test run."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_own_entry,
            args=(fn, rank, world_size, port, backend, env(rank, port) if env else {}, results),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    answers: dict[int, tuple[str, Any]] = {}
    deadline = time.monotonic() + timeout
    while len(answers) < world_size and time.monotonic() < deadline:
        try:
            rank, ok, value = results.get(timeout=0.5)
        except queue.Empty:
            if not any(proc.is_alive() for proc in procs) and results.empty():
                break
            continue
        answers[rank] = ("ok" if ok else "raised", value)
    for proc in procs:
        proc.join(timeout=max(deadline - time.monotonic(), 2.0))
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5.0)
    return [answers.get(rank, ("exit", proc.exitcode)) for rank, proc in enumerate(procs)]


# -- without a process group ----------------------------------------------------------------


@pytest.fixture
def no_torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)


def test_barrier_without_a_group_returns_true_at_once() -> None:
    assert not dist.is_initialized()
    start = time.monotonic()
    assert barrier_with_timeout(5.0) is True
    assert barrier_with_timeout(datetime.timedelta(seconds=5)) is True
    assert time.monotonic() - start < 0.5


def test_timeouts_are_validated() -> None:
    with pytest.raises(ValueError, match="timeout must be positive, got 0"):
        barrier_with_timeout(0)
    with pytest.raises(TypeError, match=r"timeout must be a datetime\.timedelta or a number"):
        barrier_with_timeout("5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be positive"):
        FirstRankPerNode(timeout=datetime.timedelta(seconds=-1))


def test_metadata_group_without_a_group_is_none() -> None:
    assert metadata_group() is None


def test_first_rank_per_node_without_a_group_yields_true(no_torchrun_env: None) -> None:
    ran = []
    with FirstRankPerNode() as first:
        ran.append(first)
    assert ran == [True]
    assert not dist.is_initialized()

    @FirstRankPerNode()
    def build() -> str:
        return "built"

    assert build() == "built"


def test_first_rank_per_node_without_a_group_propagates_errors(no_torchrun_env: None) -> None:
    with pytest.raises(KeyError, match="missing"), FirstRankPerNode():
        raise KeyError("missing")


def test_print_and_log_without_a_group(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    print_rank_0("hello", 3, sep="-")
    assert capsys.readouterr().out == "hello-3\n"
    with caplog.at_level(logging.DEBUG, logger="instrument"):
        log_rank_0("to instrument")
        log_rank_0("warned", level=logging.WARNING, logger="other")
        barrier_and_log("checkpoint saved")
    records = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert records[:2] == [
        ("instrument", logging.INFO, "to instrument"),
        ("other", logging.WARNING, "warned"),
    ]
    assert records[2][2].startswith("[checkpoint saved] datetime: 20")


def test_reduce_loss_without_a_group_sums_locally() -> None:
    losses = [torch.tensor(1.5), torch.tensor(2.5, dtype=torch.bfloat16)]
    loss, tokens = reduce_loss(losses, torch.tensor(10))
    assert loss.dtype == torch.float32
    assert loss.shape == (1,)
    assert loss.item() == 4.0
    assert tokens.dtype == torch.int32
    assert tokens.item() == 10
    loss, batches = reduce_loss(losses, 10, per_token_loss=False)
    assert batches.tolist() == [2]
    _, tokens = reduce_loss(losses, 7)
    assert tokens.tolist() == [7]
    with pytest.raises(ValueError, match="loss_store is empty"):
        reduce_loss([], 1)


def test_reduce_loss_detaches() -> None:
    weight = torch.ones(1, requires_grad=True)
    loss, _ = reduce_loss([(weight * 2).sum()], 1)
    assert not loss.requires_grad


def test_get_sync_ctx_plain_module_is_a_null_context() -> None:
    model = nn.Linear(2, 2)
    for step in (False, True):
        assert isinstance(get_sync_ctx(model, is_optim_step=step), contextlib.nullcontext)


def test_get_sync_ctx_uses_no_sync_of_any_wrapper() -> None:
    class Wrapper(nn.Module):
        entered = 0

        @contextlib.contextmanager
        def no_sync(self) -> Iterator[None]:
            Wrapper.entered += 1
            yield

    with get_sync_ctx(Wrapper(), is_optim_step=False):
        pass
    assert Wrapper.entered == 1
    assert isinstance(get_sync_ctx(Wrapper(), is_optim_step=True), contextlib.nullcontext)


def test_dp_eval_sample_shard() -> None:
    class DDPConfig:  # stands for NeMo Automodel's config classes, matched by name
        pass

    class FSDP2Config:
        pass

    assert dp_eval_sample_shard(DDPConfig(), 1, 4) == (1, 4)
    assert dp_eval_sample_shard(DDPConfig(), 0, 1) is None
    assert dp_eval_sample_shard(FSDP2Config(), 1, 4) is None
    assert dp_eval_sample_shard("ddp", 3, 4) == (3, 4)
    assert dp_eval_sample_shard("DDP", 0, 2) == (0, 2)
    assert dp_eval_sample_shard("fsdp2", 1, 4) is None
    assert dp_eval_sample_shard("megatron_fsdp", 1, 4) is None
    assert dp_eval_sample_shard(None, 1, 4) is None
    samples = list(range(10))
    shards = [dp_eval_sample_shard("ddp", rank, 3) for rank in range(3)]
    parts = [samples[s[0] :: s[1]] for s in shards if s is not None]
    assert sorted(x for part in parts for x in part) == samples  # disjoint, covering
    with pytest.raises(ValueError, match="unknown distributed strategy 'dpp'"):
        dp_eval_sample_shard("dpp", 0, 2)
    with pytest.raises(ValueError, match="got dp_rank=4, dp_size=4"):
        dp_eval_sample_shard("ddp", 4, 4)


# -- scenarios, each run on every rank of one spawned job -------------------------------------
#
# Spawning costs seconds, so one job of two ranks and one of three run several scenarios in
# turn (each leaves the ranks in step for the next), and the tests below read their parts.


def _gathered(tensor: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor)
    return parts


def _ddp_grads_match(sync: bool, rank: int) -> bool:
    """One backward under get_sync_ctx on rank-specific data: do the ranks' grads agree?"""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(4, 2))
    x = torch.full((3, 4), float(rank + 1))
    with get_sync_ctx(model, is_optim_step=sync):
        model(x).sum().backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    first, second = _gathered(grad)
    return bool(torch.equal(first, second))


#: FSDP2 runs on CPU tensors (gloo) where torch's CPU stream records events (torch 2.6's
#: fully_shard calls ``record_event`` on a ``torch.cpu.Stream``, which lacks it).
FSDP2_ON_CPU = hasattr(torch.cpu.Stream, "record_event")


def _fsdp_has_grads(is_optim_step: bool, defer: bool, rank: int) -> bool:
    """One backward of an FSDP2 model under get_sync_ctx: did it reduce-scatter grads?"""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model: Any = fully_shard(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)))
    with get_sync_ctx(model, is_optim_step, defer_fsdp_grad_sync=defer):
        model(torch.randn(2, 4) + rank).sum().backward()
    return all(p.grad is not None for p in model.parameters())


def _basics(rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    start = time.monotonic()
    out["barriers"] = [barrier_with_timeout(10.0) for _ in range(3)]
    out["barrier_seconds"] = time.monotonic() - start
    meta = metadata_group()
    out["meta_is_world"] = meta is dist.group.WORLD
    out["meta_cached"] = metadata_group() is meta

    losses = [torch.tensor(1.0 + rank), torch.tensor(2.0 * (rank + 1))]  # sums 3 and 6
    tokens = torch.tensor(10 * (rank + 1))  # 10 and 20
    world = dist.group.WORLD
    loss, denominator = reduce_loss(losses, tokens, dp_group=world)
    out["per_token"] = (loss.tolist(), denominator.tolist(), str(denominator.dtype))
    loss, denominator = reduce_loss(losses[: rank + 1], tokens, False, dp_group=world)
    out["per_batch"] = (loss.tolist(), denominator.tolist())
    loss, denominator = reduce_loss(losses, tokens)  # dp_group=None: local, as in NeMo
    out["no_group"] = (loss.tolist(), denominator.tolist())

    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        print_rank_0("from rank", rank)
    out["printed"] = stdout.getvalue()
    with captured_logs() as messages:
        log_rank_0(f"log from rank {rank}")
        barrier_and_log("step 10")
    out["logged"] = messages

    out["ddp_no_sync_equal"] = _ddp_grads_match(False, rank)
    out["ddp_sync_equal"] = _ddp_grads_match(True, rank)
    out["fsdp"] = None
    if FSDP2_ON_CPU:
        out["fsdp"] = [
            _fsdp_has_grads(False, True, rank),  # deferred: no reduce-scatter, no sharded grad
            _fsdp_has_grads(True, True, rank),
            _fsdp_has_grads(False, False, rank),  # not deferred: synced every micro-batch
        ]
    return out


TIMEOUT = 1.5


def _late_barrier(rank: int, late: int) -> dict[str, Any]:
    """Rank ``late`` reaches a barrier well after the others' timeout."""
    with captured_logs() as messages:
        start = time.monotonic()
        if rank == late:
            time.sleep(TIMEOUT + 2.5)  # sleeps past the others' timeout, then arrives
            start = time.monotonic()
        first = barrier_with_timeout(TIMEOUT)
        seconds = time.monotonic() - start
        dist.barrier()  # the process group still works...
        after = barrier_with_timeout(10.0)  # ...and so do later timed barriers
        t = torch.tensor([rank])
        dist.all_reduce(t)
    return {"first": first, "seconds": seconds, "after": after, "sum": int(t), "logs": messages}


def _failing_first_rank(rank: int) -> dict[str, Any]:
    """The block raises on rank 0, the first rank."""
    start = time.monotonic()
    ran = False
    error = ""
    try:
        with FirstRankPerNode(timeout=60):
            ran = True
            if rank == 0:
                raise ValueError("disk full")
    except (ValueError, RuntimeError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    seconds = time.monotonic() - start
    return {"ran": ran, "error": error, "seconds": seconds, "after": barrier_with_timeout(10)}


def two_rank_worker(rank: int, world_size: int) -> dict[str, Any]:
    return {
        "basics": _basics(rank),
        "rank_0_late": _late_barrier(rank, late=0),
        "failing_first_rank": _failing_first_rank(rank),
    }


def _first_rank_per_node(rank: int) -> dict[str, Any]:
    os.environ["LOCAL_RANK"] = str([0, 1, 0][rank])  # two "nodes": ranks 0, 1 and rank 2
    with FirstRankPerNode() as first:
        start = time.time()
        if first:
            time.sleep(0.5)
        end = time.time()

    @FirstRankPerNode(timeout=30)
    def again() -> float:
        return time.time()

    return {"first": first, "start": start, "end": end, "again": again()}


def _failing_first_rank_of_one_node(rank: int) -> dict[str, Any]:
    """Ranks 0 and 2 are the first ranks of two nodes; the block raises on rank 2 only."""
    error = ""
    try:
        with FirstRankPerNode(timeout=60):
            if rank == 2:
                raise OSError("no space left")
    except (OSError, RuntimeError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {"error": error, "after": barrier_with_timeout(10)}


def _metadata(rank: int, world_size: int) -> dict[str, Any]:
    """The world's backend is "cpu:gloo": not plain gloo, so metadata groups are created."""
    meta = metadata_group()
    names: list[Any] = [None] * world_size
    dist.all_gather_object(names, f"rank{rank}", group=meta)
    sub = dist.new_group([0, 1], backend="cpu:gloo")  # every rank creates it (torch's rule)
    sub_meta = metadata_group(sub) if rank in (0, 1) else None  # only its members call
    return {
        "backend": dist.get_backend(),
        "meta_backend": dist.get_backend(meta),
        "new": meta is not dist.group.WORLD,
        "cached": metadata_group() is meta and (rank == 2 or metadata_group(sub) is sub_meta),
        "names": names,
        "sub_ranks": None if sub_meta is None else dist.get_process_group_ranks(sub_meta),
        "sub_barrier": barrier_with_timeout(10.0, group=sub),  # True at once on rank 2
        "outside": metadata_group(sub) if rank == 2 else None,
    }


def three_rank_worker(rank: int, world_size: int) -> dict[str, Any]:
    return {
        "first_rank_per_node": _first_rank_per_node(rank),
        "node_failure": _failing_first_rank_of_one_node(rank),
        "rank_2_late": _late_barrier(rank, late=2),
        "metadata": _metadata(rank, world_size),
    }


@pytest.fixture(scope="module")
def two() -> list[dict[str, Any]]:
    return run_ranks(two_rank_worker, 2, timeout=90)


@pytest.fixture(scope="module")
def three() -> list[dict[str, Any]]:
    results = spawn(three_rank_worker, 3, backend="cpu:gloo", timeout=90)
    for status, value in results:
        assert status == "ok", value
    return [value for _, value in results]


@pytest.mark.timeout(120)
def test_barrier_all_arrive(two: list[dict[str, Any]]) -> None:
    for result in two:
        assert result["basics"]["barriers"] == [True, True, True]
        assert result["basics"]["barrier_seconds"] < 5.0


@pytest.mark.timeout(120)
def test_reduce_loss_over_two_ranks(two: list[dict[str, Any]]) -> None:
    basics = [r["basics"] for r in two]
    for result in basics:
        assert result["per_token"] == ([9.0], 30, "torch.int32")  # (3 + 6) / (10 + 20)
        assert result["per_batch"] == ([1.0 + 2.0 + 4.0], [1 + 2])  # rank 0: 1 loss, rank 1: 2
    assert [r["no_group"] for r in basics] == [([3.0], 10), ([6.0], 20)]


@pytest.mark.timeout(120)
def test_print_and_log_only_on_rank_0(two: list[dict[str, Any]]) -> None:
    basics = [r["basics"] for r in two]
    assert [r["printed"] for r in basics] == ["from rank 0\n", ""]
    logged = basics[0]["logged"]
    assert len(logged) == 2
    assert logged[0] == "log from rank 0"
    assert logged[1].startswith("[step 10] datetime: ")
    assert basics[1]["logged"] == []


@pytest.mark.timeout(120)
def test_get_sync_ctx_with_ddp_skips_the_all_reduce(two: list[dict[str, Any]]) -> None:
    for result in two:
        assert result["basics"]["ddp_no_sync_equal"] is False  # no_sync: own grads per rank
        assert result["basics"]["ddp_sync_equal"] is True  # optimizer step: all-reduced


@pytest.mark.timeout(120)
@pytest.mark.skipif(not FSDP2_ON_CPU, reason="this torch's FSDP2 does not run on CPU")
def test_get_sync_ctx_with_fsdp2_defers_the_reduce_scatter(two: list[dict[str, Any]]) -> None:
    for result in two:
        assert result["basics"]["fsdp"] == [False, True, True]


def _check_late(results: list[dict[str, Any]], late: int) -> None:
    world_size = len(results)
    for rank, result in enumerate(results):
        assert result["first"] is False
        assert result["after"] is True
        assert result["sum"] == sum(range(world_size))
        (message,) = result["logs"]
        expected = (
            f"instrument: barrier timed out after {TIMEOUT:.1f} s; ranks [{late}] did not "
            f"arrive (group of {world_size})"
        )
        assert message.startswith(expected)
        if rank == late:
            assert result["seconds"] < 1.0  # learns at once that the others gave up
            assert message.endswith(f"; rank {late} arrived after the others had given up")
        else:
            assert message == expected
            assert TIMEOUT - 0.1 < result["seconds"] < TIMEOUT + 3.0


@pytest.mark.timeout(120)
def test_barrier_timeout_names_a_missing_rank_0(two: list[dict[str, Any]]) -> None:
    _check_late([r["rank_0_late"] for r in two], late=0)


@pytest.mark.slow  # three ranks
@pytest.mark.timeout(120)
def test_barrier_timeout_names_a_missing_rank_2(three: list[dict[str, Any]]) -> None:
    _check_late([r["rank_2_late"] for r in three], late=2)


@pytest.mark.timeout(120)
def test_metadata_group_of_a_gloo_group_is_the_group(two: list[dict[str, Any]]) -> None:
    assert all(r["basics"]["meta_is_world"] and r["basics"]["meta_cached"] for r in two)


@pytest.mark.slow  # three ranks
@pytest.mark.timeout(120)
def test_metadata_group_of_another_backend_is_a_new_cached_gloo_group(
    three: list[dict[str, Any]],
) -> None:
    metadata = [r["metadata"] for r in three]
    for result in metadata:
        assert result["backend"] != "gloo"
        assert result["meta_backend"] == "gloo"
        assert result["new"]
        assert result["cached"]
        assert result["names"] == ["rank0", "rank1", "rank2"]
        assert result["sub_barrier"] is True
        assert result["outside"] is None
    assert [r["sub_ranks"] for r in metadata] == [[0, 1], [0, 1], None]


@pytest.mark.slow  # three ranks
@pytest.mark.timeout(120)
def test_first_rank_per_node_runs_first(three: list[dict[str, Any]]) -> None:
    results = [r["first_rank_per_node"] for r in three]
    assert [r["first"] for r in results] == [True, False, True]
    first_done = max(results[0]["end"], results[2]["end"])
    assert results[1]["start"] >= first_done  # rank 1 began after both first ranks ended
    assert results[2]["start"] < results[0]["end"]  # the first ranks of the nodes overlap


@pytest.mark.timeout(120)
def test_first_rank_failure_stops_the_waiting_ranks(two: list[dict[str, Any]]) -> None:
    first, other = (r["failing_first_rank"] for r in two)
    assert first["ran"]
    assert first["error"] == "ValueError: disk full"
    assert not other["ran"]  # the block never ran where the first rank's result is missing
    assert other["error"].startswith("RuntimeError: FirstRankPerNode: the block raised")
    assert "rank 0: ValueError: disk full" in other["error"]
    assert other["seconds"] < 10.0
    assert first["after"] is True
    assert other["after"] is True


@pytest.mark.slow  # three ranks
@pytest.mark.timeout(120)
def test_first_rank_failure_on_one_node_stops_every_rank(three: list[dict[str, Any]]) -> None:
    first, waiting, failed = (r["node_failure"] for r in three)
    assert failed["error"] == "OSError: no space left"
    cause = "(rank 2: OSError: no space left)"
    assert first["error"] == (
        f"RuntimeError: FirstRankPerNode: the block raised on another node {cause}; "
        "stopping rank 0 too"
    )
    assert waiting["error"] == (
        f"RuntimeError: FirstRankPerNode: the block raised {cause}; not running it on rank 1"
    )
    assert all(r["node_failure"]["after"] is True for r in three)


# -- jobs that end abnormally or start without a group ----------------------------------------


def crashing_first_rank_worker(rank: int, world_size: int) -> dict[str, Any]:
    start = time.monotonic()
    try:
        with FirstRankPerNode(timeout=60):
            if rank == 0:
                time.sleep(1.0)  # rank 1 is waiting by now
                os._exit(3)  # dies hard inside the block (and takes the store with it)
    except RuntimeError as exc:
        return {"error": str(exc), "seconds": time.monotonic() - start}
    return {"error": "", "seconds": time.monotonic() - start}


@pytest.mark.slow  # two more processes
@pytest.mark.timeout(60)
def test_first_rank_crash_does_not_leave_the_others_waiting() -> None:
    (status0, code), (status1, result) = spawn(crashing_first_rank_worker, 2, timeout=40)
    assert (status0, code) == ("exit", 3)
    assert status1 == "ok", result
    assert result["error"].startswith("FirstRankPerNode: rank 1 stopped waiting")
    assert "timeout 60 s" in result["error"]
    assert result["seconds"] < 15.0


def bootstrap_worker(rank: int, world_size: int) -> dict[str, Any]:
    before = dist.is_initialized()
    with FirstRankPerNode() as first:
        inside = dist.is_initialized() and dist.get_world_size() == world_size
        stamp = time.time()
        if first:
            time.sleep(0.3)
    return {
        "before": before,
        "inside": inside,
        "after": dist.is_initialized(),
        "first": first,
        "stamp": stamp,
    }


def _torchrun_env(rank: int, port: int) -> dict[str, str]:
    return {
        "WORLD_SIZE": "2",
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


@pytest.mark.slow  # two more processes
@pytest.mark.timeout(60)
def test_first_rank_per_node_starts_and_ends_a_group_from_torchrun_env() -> None:
    results = spawn(bootstrap_worker, 2, backend=None, env=_torchrun_env, timeout=45)
    values = []
    for status, value in results:
        assert status == "ok", value
        values.append(value)
    assert [(v["before"], v["inside"], v["after"]) for v in values] == [(False, True, False)] * 2
    assert [v["first"] for v in values] == [True, False]
    assert values[1]["stamp"] >= values[0]["stamp"] + 0.3
