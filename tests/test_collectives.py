"""Collective patches and the DDP comm hook, on real gloo process groups."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from distributed_helpers import GROUP_TIMEOUT, free_port, run_ranks
from torch.distributed import distributed_c10d as c10d

import instrument
from instrument.hooks import collectives
from instrument.report import Report
from instrument.testing import reset

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is missing")

WORLD = 2


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# -- workers (module level: spawned processes import them) --------------------------------


def sync_worker(rank: int, world: int) -> dict[str, Any]:
    """Each sync collective, instrumented and not, positionally and by keyword."""
    plain = {n: getattr(dist, n) for n in collectives.BUFFERS if hasattr(dist, n)}
    undo = collectives.install()
    reporter = instrument.Reporter(every=None)
    same: dict[str, bool] = {}
    unsupported: list[str] = []

    def both(name: str, make: Callable[[], tuple[Any, ...]], call: Callable[..., Any]) -> None:
        """Run ``call`` with the original and with the patched function on equal inputs."""
        timed_args, plain_args = make(), make()
        instrument.disable()  # the originals may call patched siblings (all_gather_single)
        try:
            call(plain[name], *plain_args)
        except RuntimeError as exc:  # older gloo lacks some (all_to_all before torch 2.13)
            if "does not support" not in str(exc):
                raise
            unsupported.append(name)
            return
        finally:
            instrument.enable()
        call(getattr(dist, name), *timed_args)
        same[name] = all(torch.equal(a, b) for a, b in zip(timed_args, plain_args, strict=True))

    base = torch.arange(6, dtype=torch.float32) + 10 * rank
    with instrument.timed("sync"):
        both("all_reduce", lambda: (base.clone(),), lambda f, t: f(t))
        dist.all_reduce(tensor=base.clone(), op=dist.ReduceOp.MAX)  # keywords
        both("broadcast", lambda: (base.double(),), lambda f, t: f(t, 0))
        dist.broadcast(tensor=base.double(), src=1)
        both(
            "all_gather_into_tensor",
            lambda: (torch.zeros(6 * world, dtype=torch.int32), base.int()),
            lambda f, out, inp: f(out, inp),
        )
        both(
            "all_gather",
            lambda: (*(torch.zeros(6) for _ in range(world)), base.clone()),
            lambda f, *ts: f(list(ts[:-1]), ts[-1]),
        )
        both(
            "reduce_scatter_tensor",
            lambda: (torch.zeros(3), base.clone()),
            lambda f, out, inp: f(output=out, input=inp),
        )
        both(
            "all_to_all_single",
            lambda: (torch.zeros(6, dtype=torch.float64), base.double()),
            lambda f, out, inp: f(out, inp),
        )
        both(
            "reduce_scatter",
            lambda: (torch.zeros(2), *(base[:2] + i for i in range(world))),
            lambda f, out, *ins: f(out, list(ins)),
        )
        both(
            "all_to_all",
            lambda: (*(torch.zeros(3) for _ in range(world)), *base.split(3)),
            lambda f, *ts: f(list(ts[:world]), input_tensor_list=list(ts[world:])),
        )
        both("reduce", lambda: (base.clone(),), lambda f, t: f(t, dst=0))
        both(
            "gather",  # counts the local (input) tensor on every rank
            lambda: (base[:4].clone(), *(torch.zeros(4) for _ in range(world))),
            lambda f, t, *ts: f(t, list(ts) if rank == 0 else None, dst=0),
        )
        both(
            "scatter",  # counts the local (output) tensor on every rank
            lambda: (torch.zeros(1), *base[:world].split(1)),
            lambda f, t, *ts: f(t, list(ts) if rank == 0 else None, src=0),
        )
        if hasattr(dist, "all_gather_single"):  # torch >= 2.13; the *_tensor names call these
            dist.all_gather_single(torch.zeros(2 * world), torch.ones(2))
            dist.reduce_scatter_single(torch.zeros(1).double(), torch.ones(world).double())
        dist.barrier()
    instrument.disable()
    dist.all_reduce(base.clone())  # disabled: not recorded
    instrument.enable()
    report = reporter.flush()
    undo()
    return {"report": report.to_dict(), "same": same, "unsupported": unsupported}


def async_worker(rank: int, world: int) -> dict[str, Any]:
    """async_op=True until wait(); no wait(); isend/irecv; send/recv; batch_isend_irecv."""
    plain_isend, plain_irecv = dist.isend, dist.irecv
    undo = collectives.install()
    reporter = instrument.Reporter(every=None)
    facts: dict[str, Any] = {}
    t = torch.ones(5) * (rank + 1)
    with instrument.timed("outer"):
        work = dist.all_reduce(t, async_op=True)
        facts["is_work"] = isinstance(work, dist.Work)
        with instrument.timed("between"):
            pass
        facts["wait_result"] = work.wait()
    facts["async_sum"] = t.tolist()
    with instrument.timed("nowait"):
        lost = dist.all_reduce(torch.ones(5), async_op=True)
    lost.get_future().wait()  # not Work.wait(): nothing recorded
    peer = 1 - rank
    buf = torch.full((3,), float(rank), dtype=torch.float64)
    with instrument.timed("p2p"):
        if rank == 0:
            dist.isend(buf, dst=peer).wait()
            dist.send(buf, peer)
        else:
            dist.irecv(tensor=buf, src=peer).wait()
            dist.recv(buf, src=peer)
    facts["p2p"] = buf.tolist()
    got = torch.zeros(4)
    ops = [
        dist.P2POp(plain_isend, torch.full((4,), float(rank)), peer),  # made with the original
        dist.P2POp(dist.irecv, got, peer),
    ]
    with instrument.timed("batch"):
        works = dist.batch_isend_irecv(ops)
        for w in works:
            w.wait()
    facts["batch_got"] = got.tolist()
    facts["ops_kept"] = ops[0].op is plain_isend and ops[1].op is dist.irecv
    report = reporter.flush()
    got_stale = torch.zeros(2)
    stale = [
        dist.P2POp(dist.isend, torch.full((2,), 7.0 + rank), peer),
        dist.P2POp(dist.irecv, got_stale, peer),
    ]
    undo()
    facts["restored"] = dist.isend is plain_isend and dist.irecv is plain_irecv
    for w in dist.batch_isend_irecv(stale):  # ops made while patched, run unpatched
        w.wait()
    facts["stale_got"] = got_stale.tolist()
    return {"report": report.to_dict(), **facts}


def _train_ddp(hooked: bool, steps: int) -> tuple[list[list[float]], dict[str, Any]]:
    """A small DDP model trained ``steps`` steps on rank-dependent data."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    )
    facts: dict[str, Any] = {}
    if hooked:
        facts["hooked"] = collectives.hook_ddp(model)
        facts["hooked_again"] = collectives.hook_ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(steps):
        x = torch.randn(4, 8, generator=gen)
        with instrument.timed("step"):
            loss = model(x).square().mean()
            with instrument.timed("backward"):
                loss.backward()
            opt.step()
            opt.zero_grad()
    params = [p.detach().flatten().tolist() for p in model.parameters()]
    facts["param_bytes"] = sum(nbytes(p) for p in model.parameters())
    facts["model"] = model
    return params, facts


def ddp_worker(rank: int, world: int, steps: int) -> dict[str, Any]:
    """DDP with and without the timed hook: same parameters; then the hook after undo."""
    reporter = instrument.Reporter(every=None)
    plain_params, _ = _train_ddp(hooked=False, steps=steps)
    reporter.flush()  # drop the unhooked run's regions
    undo = collectives.install()
    params, facts = _train_ddp(hooked=True, steps=steps)
    report = reporter.flush()
    undo()
    model = facts.pop("model")
    model(torch.randn(2, 8)).sum().backward()  # the hook stays, passing through
    after = reporter.flush()
    return {
        "report": report.to_dict(),
        "after": after.to_dict(),
        "params": params,
        "plain_params": plain_params,
        **facts,
    }


# -- multi-process tests ------------------------------------------------------------------


def sync_and_async_worker(rank: int, world: int) -> dict[str, Any]:
    """Both workers in turn on one pair of processes."""
    sync = sync_worker(rank, world)
    reset()
    return {"sync": sync, "async": async_worker(rank, world)}


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    """What each rank's workers returned: one spawn for the module, not one a worker."""
    return run_ranks(sync_and_async_worker, WORLD, timeout=100)


@pytest.fixture(scope="module")
def sync_results(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["sync"] for r in results]


@pytest.fixture(scope="module")
def async_results(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r["async"] for r in results]


@pytest.mark.timeout(120)
def test_sync_collectives_are_regions_with_nccl_tests_bytes(
    sync_results: list[dict[str, Any]],
) -> None:
    six, world = 6 * 4, WORLD
    expected = {  # path: (count, bytes); both ranks alike
        "sync/all_reduce": (2, 2 * six),  # positional + keyword; the tensor
        "sync/broadcast": (2, 2 * 6 * 8),  # float64
        "sync/all_gather_into_tensor": (1, 6 * world * 4),  # the output (int32)
        "sync/all_gather": (1, world * six),  # the output list
        "sync/reduce_scatter_tensor": (1, six),  # the input
        "sync/all_to_all_single": (1, 6 * 8),  # the input (float64)
        "sync/barrier": (1, 0),
        "sync/reduce_scatter": (1, world * 2 * 4),  # the input list
        "sync/all_to_all": (1, six),  # the input list
        "sync/reduce": (1, six),
        "sync/gather": (1, 4 * 4),
        "sync/scatter": (1, 4),
    }
    if hasattr(dist, "all_gather_single"):  # not recorded again below the *_tensor names
        expected["sync/all_gather_single"] = (1, 2 * world * 4)
        expected["sync/reduce_scatter_single"] = (1, world * 8)
    for result in sync_results:
        report = Report.from_dict(result["report"])
        # gloo before torch 2.13 lacks all_to_all; torch 2.6's lacks reduce_scatter too
        assert set(result["unsupported"]) <= {"all_to_all", "reduce_scatter"}
        for name in result["unsupported"]:
            expected.pop(f"sync/{name}", None)
        for path, (count, size) in expected.items():
            node = report[path]
            assert (node.count, node.bytes, node.concurrent) == (count, size, False), path
        assert sorted(report.paths()) == sorted(["sync", *expected])  # disabled: nothing


@pytest.mark.timeout(120)
def test_instrumented_results_equal_uninstrumented(sync_results: list[dict[str, Any]]) -> None:
    for result in sync_results:
        assert result["same"] == dict.fromkeys(result["same"], True)
        assert len(result["same"]) + len(result["unsupported"]) == 11


@pytest.mark.timeout(120)
def test_async_all_reduce_is_a_concurrent_span_until_wait(
    async_results: list[dict[str, Any]],
) -> None:
    for result in async_results:
        report = Report.from_dict(result["report"])
        assert result["is_work"] is True
        assert result["wait_result"] is True
        assert result["async_sum"] == [3.0] * 5
        node = report["outer/all_reduce (async)"]  # apart from sync all_reduce calls
        assert (node.count, node.bytes, node.concurrent) == (1, 5 * 4, True)
        assert "outer/between" in report  # opened before wait(): not nested under the span
        assert "outer/all_reduce (async)/between" not in report
        assert "(async) (async)" not in report.render()
        assert not any(p.startswith("nowait/") for p in report.paths())  # no wait(): nothing


@pytest.mark.timeout(120)
def test_point_to_point_and_batches(async_results: list[dict[str, Any]]) -> None:
    kinds = [("isend", "send"), ("irecv", "recv")]
    for rank, result in enumerate(async_results):
        report = Report.from_dict(result["report"])
        nonblocking, blocking = kinds[rank]
        assert report[f"p2p/{nonblocking}"].concurrent
        assert report[f"p2p/{nonblocking}"].bytes == 3 * 8
        assert report[f"p2p/{blocking}"].bytes == 3 * 8
        assert not report[f"p2p/{blocking}"].concurrent
        assert result["p2p"] == [0.0] * 3
        batch = report["batch/batch_isend_irecv"]
        assert (batch.count, batch.bytes, batch.concurrent) == (1, 2 * 4 * 4, True)
        assert [p for p in report.paths() if p.startswith("batch/")] == [batch.path]
        assert result["batch_got"] == [float(1 - rank)] * 4
        assert result["ops_kept"] is True
        assert result["restored"] is True
        assert result["stale_got"] == [7.0 + 1 - rank] * 2


@pytest.mark.slow  # two ranks, a third spawn
@pytest.mark.timeout(120)
def test_ddp_comm_hook_times_buckets_and_keeps_training_identical() -> None:
    steps = 3
    results = run_ranks(ddp_worker, WORLD, steps, timeout=100)
    for result in results:
        assert (result["hooked"], result["hooked_again"]) == (True, False)
        report = Report.from_dict(result["report"])
        node = report["step/backward/ddp_all_reduce"]
        assert node.count >= steps
        assert node.bytes == steps * result["param_bytes"]
        assert node.concurrent
        assert not any(p.endswith("all_reduce") and "ddp" not in p for p in report.paths())
        assert result["params"] == result["plain_params"]
        after = Report.from_dict(result["after"])
        assert not any("ddp_all_reduce" in p for p in after.paths())
    assert results[0]["params"] == results[1]["params"]


# -- one process --------------------------------------------------------------------------


def test_undo_restores_the_exact_originals_in_both_namespaces() -> None:
    originals = {n: getattr(dist, n) for n in collectives.BUFFERS if hasattr(dist, n)}
    undo = collectives.install()
    wrapper = dist.all_reduce
    assert wrapper is not originals["all_reduce"]
    assert c10d.all_reduce is wrapper  # one wrapper, both namespaces
    assert wrapper.__wrapped__ is originals["all_reduce"]
    assert inspect.signature(wrapper) == inspect.signature(originals["all_reduce"])
    undo()
    undo()  # idempotent
    for name, original in originals.items():
        assert getattr(dist, name) is original, name
        assert getattr(c10d, name) is original, name


def test_nested_installs_are_reference_counted() -> None:
    original = dist.all_reduce
    first, second = collectives.install(), collectives.install()
    first()
    assert dist.all_reduce is not original
    assert c10d.all_reduce is not original
    second()
    assert dist.all_reduce is original
    assert c10d.all_reduce is original


def test_hook_ddp_leaves_other_models_alone() -> None:
    assert collectives.hook_ddp(torch.nn.Linear(2, 2)) is False
    assert collectives.hook_ddp(object()) is False


def test_comm_hook_keeps_the_wrapped_hooks_name_and_signature() -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    hook = collectives.timed_comm_hook(default_hooks.fp16_compress_hook)
    assert hook.__name__ == "fp16_compress_hook"
    assert inspect.signature(hook) == inspect.signature(default_hooks.fp16_compress_hook)
    assert inspect.signature(collectives.timed_comm_hook()).return_annotation is inspect._empty
    with pytest.raises(ValueError, match="contains '/'"):
        collectives.timed_comm_hook(name="a/b")


@pytest.fixture
def single_group() -> Iterator[None]:
    """A one-process gloo group in this process."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=GROUP_TIMEOUT,
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def _double_and_reduce(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    dist.all_reduce(y)
    return y + 1


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("single_group")
def test_compiled_collectives_still_compile_fullgraph(reporter: instrument.Reporter) -> None:
    torch._dynamo.reset()
    try:
        torch.compile(_double_and_reduce, backend="eager", fullgraph=True)(torch.ones(2))
    except Exception as exc:  # pragma: no cover - depends on the torch build
        pytest.skip(f"Dynamo cannot trace dist.all_reduce even uninstrumented: {exc}")
    torch._dynamo.reset()
    undo = collectives.install()
    try:
        compiled = torch.compile(_double_and_reduce, backend="eager", fullgraph=True)
        assert compiled(torch.ones(2)).tolist() == [3.0, 3.0]
        dist.all_reduce(torch.ones(2))  # eager: timed
    finally:
        undo()
        torch._dynamo.reset()
    report = reporter.flush()
    assert report["all_reduce"].count == 1
    assert report["all_reduce"].bytes == 8


def _lost_bucket(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_exception(ValueError("bucket lost"))
    return fut


_lost_bucket.__annotations__.clear()  # DDP checks them as objects; postponed, they are strings


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("single_group")
def test_a_failed_bucket_reaches_the_user_as_its_own_error() -> None:
    """DDP passes a bucket's error on through the timed hook's future callback; backward()
    raises the error itself, without the callback's prefix or instrument's frames."""
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    ddp.register_comm_hook(None, collectives.timed_comm_hook(_lost_bucket))
    with (
        instrument.auto(ddp, sinks=[]),
        pytest.raises(ValueError, match=r"^bucket lost$") as raised,
    ):
        ddp(torch.ones(2, 4)).sum().backward()
    assert raised.value.__suppress_context__
    assert not any("hooks/collectives.py" in str(entry.path) for entry in raised.traceback)
