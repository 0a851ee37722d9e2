"""Time ``torch.distributed`` collectives and DDP's gradient all-reduce.

:func:`install` patches the Python collectives (``all_reduce``, ``broadcast``, ...) on both
``torch.distributed`` and ``torch.distributed.distributed_c10d``. A synchronous call is a
region named after the function, nested under whatever region is open
("backward/all_reduce"); an asynchronous one (``async_op=True``, ``isend``/``irecv``,
``batch_isend_irecv``) is a :class:`~instrument.regions.span.Span` from the call until its
work's ``wait()`` returns, on a path of its own, ``"<name> (async)"``, marked concurrent.
Each call also counts the bytes it moves, in nccl-tests' "size" convention (see
:data:`BUFFERS`), read from ``numel() * element_size()`` — nothing here waits on,
synchronizes or reads the device.

DDP all-reduces gradients in C++, out of the patches' sight: :func:`hook_ddp` registers
:func:`timed_comm_hook`, which times each bucket from the hook call until its future
completes.

Example:
    >>> undo = instrument.hooks.collectives.install()
    >>> with instrument.timed("backward"):
    ...     dist.all_reduce(grad)          # recorded as "backward/all_reduce", with its bytes
    >>> work = dist.all_reduce(grad, async_op=True)
    >>> work.wait()                        # "all_reduce (async)" (concurrent): call -> wait()
    >>> undo()                             # the exact original functions are back
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import torch
import wrapt
from torch import nn

from instrument import registry
from instrument.hooks.modules import held_chain
from instrument.hooks.patches import patch
from instrument.regions.frames import get_top
from instrument.regions.region import check_name
from instrument.regions.span import Span
from instrument.regions.timed import timed
from instrument.registry import ROOT, PathNode

try:
    from torch.compiler import is_compiling
except ImportError:  # pragma: no cover - torch < 2.3

    def is_compiling() -> bool:
        return False


Args = tuple[Any, ...]
Kwargs = dict[str, Any]
Hook = Callable[[Any, Any], torch.futures.Future[torch.Tensor]]

#: Which buffer each collective's bytes are read from (nccl-tests "size"): the argument's
#: name, and whether it is one tensor ("tensor"), a list of tensors ("list"), a list of
#: ``P2POp`` ("ops"), or nothing ("none"). gather and scatter count the local tensor.
BUFFERS: dict[str, tuple[str, str]] = {
    "all_reduce": ("tensor", "tensor"),
    "all_gather": ("tensor_list", "list"),
    "all_gather_into_tensor": ("output_tensor", "tensor"),
    "all_gather_single": ("output_tensor", "tensor"),
    "reduce_scatter": ("input_list", "list"),
    "reduce_scatter_tensor": ("input", "tensor"),
    "reduce_scatter_single": ("input", "tensor"),
    "broadcast": ("tensor", "tensor"),
    "reduce": ("tensor", "tensor"),
    "gather": ("tensor", "tensor"),
    "scatter": ("tensor", "tensor"),
    "barrier": ("", "none"),
    "all_to_all": ("input_tensor_list", "list"),
    "all_to_all_single": ("input", "tensor"),
    "send": ("tensor", "tensor"),
    "recv": ("tensor", "tensor"),
    "isend": ("tensor", "tensor"),
    "irecv": ("tensor", "tensor"),
    "batch_isend_irecv": ("p2p_op_list", "ops"),
}

#: Collectives that always return work (or a list of works), whatever their arguments.
ALWAYS_ASYNC = frozenset({"isend", "irecv", "batch_isend_irecv"})

#: Where :func:`timed_comm_hook` records DDP's buckets: ``auto()`` sets this to return the
#: node of its open backward region. Unset, or returning ``None``: the region open on the
#: hook's thread, else a top-level "backward".
anchor: Callable[[], PathNode | None] | None = None

# How many install()s are live: with none, every wrapper (and a DDP hook, which DDP cannot
# unregister) passes straight through.
_installs = 0
_installs_lock = threading.Lock()
# True while a timed collective (or DDP hook) runs: what it calls itself is not timed again.
_inside: ContextVar[bool] = ContextVar("instrument_collective", default=False)
# id(original function) -> (original, its one wrapper), shared by both namespaces. Keyed by
# identity: a wrapt proxy compares equal to the function it wraps.
_wrappers: dict[int, tuple[Any, Any]] = {}


# -- bytes --------------------------------------------------------------------------------


def _tensor_bytes(tensor: object) -> int:
    """Bytes of one tensor (from its shape and dtype only), 0 for anything else."""
    if isinstance(tensor, torch.Tensor):
        return tensor.numel() * tensor.element_size()
    return 0


def _list_bytes(tensors: object) -> int:
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, Iterable):
        return _tensor_bytes(tensors)
    return sum(_tensor_bytes(t) for t in tensors)


def _ops_bytes(ops: object) -> int:
    if not isinstance(ops, Iterable):
        return 0
    return sum(_tensor_bytes(getattr(op, "tensor", None)) for op in ops)


def _no_bytes(value: object) -> int:
    return 0


_MEASURES: dict[str, Callable[[object], int]] = {
    "tensor": _tensor_bytes,
    "list": _list_bytes,
    "ops": _ops_bytes,
    "none": _no_bytes,
}


def _picker(original: Callable[..., Any], name: str) -> Callable[[Args, Kwargs], Any]:
    """A reader of the argument ``name`` of ``original``, given by position or keyword."""
    params = list(inspect.signature(original).parameters)
    if name not in params:
        return lambda args, kwargs: kwargs.get(name)
    pos = params.index(name)
    return lambda args, kwargs: args[pos] if len(args) > pos else kwargs.get(name)


# -- async work ---------------------------------------------------------------------------


if TYPE_CHECKING:
    _Proxy = wrapt.ObjectProxy[Any]
else:  # wrapt < 2 proxies are not subscriptable
    _Proxy = wrapt.ObjectProxy


class TimedWork(_Proxy):
    """A collective's ``Work`` whose ``wait()`` also ends the collective's span.

    Everything else — ``isinstance(work, dist.Work)``, ``is_completed()``,
    ``get_future()`` — is the real work's; C++ APIs that take a ``Work`` need
    ``work.__wrapped__``.
    """

    def __init__(self, work: Any, done: Callable[[], None]) -> None:
        super().__init__(work)
        self._self_done: Callable[[], None] | None = done

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        """The real ``wait()``; when it returns, the span ends (once)."""
        result = self.__wrapped__.wait(*args, **kwargs)
        done, self._self_done = self._self_done, None
        if done is not None:
            done()
        return result


def _ender(span: Span, nbytes: int, parts: int = 1) -> Callable[[], None]:
    """End ``span`` (and count its bytes) after ``parts`` calls."""
    left = [parts]

    def done() -> None:
        left[0] -= 1
        if left[0]:
            return
        node = span.node
        span.end()
        if node is not None and nbytes:
            registry.add_bytes(node, nbytes)

    return done


def _timed_works(result: Any, span: Span, nbytes: int) -> Any:
    """Wrap the work (or list of works) a call returned; ``None`` stays ``None``."""
    if result is None:
        return None
    if isinstance(result, list):
        if not result:
            return result
        done = _ender(span, nbytes, len(result))
        return [TimedWork(work, done) for work in result]
    return TimedWork(result, _ender(span, nbytes))


# -- the wrappers -------------------------------------------------------------------------


@contextlib.contextmanager
def suppressed() -> Iterator[None]:
    """Collectives called inside are not timed: instrument's own gathers and barriers never
    show up in a report."""
    token = _inside.set(True)
    try:
        yield
    finally:
        _inside.reset(token)


def _run_inside(wrapped: Callable[..., Any], args: Args, kwargs: Kwargs) -> Any:
    token = _inside.set(True)
    try:
        return wrapped(*args, **kwargs)
    finally:
        _inside.reset(token)


def _make_wrapper(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """The wrapt wrapper timing calls of collective ``name``."""
    param, kind = BUFFERS[name]
    measure = _MEASURES[kind]
    buffer = _picker(original, param) if param else None
    always_async = name in ALWAYS_ASYNC
    async_op = None if always_async else _picker(original, "async_op")
    region = timed(name)
    async_name = f"{name} (async)"

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: Args, kwargs: Kwargs) -> Any:
        if is_compiling() or not _installs or region.mode is None or _inside.get():
            return wrapped(*args, **kwargs)
        nbytes = measure(buffer(args, kwargs)) if buffer is not None else 0
        if always_async:
            span = Span(name)
            return _timed_works(_run_inside(wrapped, args, kwargs), span, nbytes)
        if async_op is not None and async_op(args, kwargs):
            # its own path: a sync call of the same collective is not concurrent work
            span = Span(async_name)
            return _timed_works(_run_inside(wrapped, args, kwargs), span, nbytes)
        with region:
            if nbytes:
                registry.add_bytes(get_top().node, nbytes)
            return _run_inside(wrapped, args, kwargs)

    return wrapper


def _p2p_batch_wrapper(inner: Callable[..., Any]) -> Callable[..., Any]:
    """``batch_isend_irecv`` tells sends from receives by ``op.op is isend``: an op made with
    the unpatched ``isend`` (bound before install) gets the patched one for the call."""
    from torch.distributed import distributed_c10d as c10d

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: Args, kwargs: Kwargs) -> Any:
        ops = args[0] if args else kwargs.get("p2p_op_list", ())
        swapped = []
        for op in ops if isinstance(ops, list) else ():
            fn = getattr(op, "op", None)
            for current in (c10d.isend, c10d.irecv):
                if fn is not current and fn == current:  # the same function, unpatched
                    swapped.append((op, fn))
                    op.op = current
        try:
            return inner(wrapped, instance, args, kwargs)
        finally:
            for op, was in swapped:
                op.op = was

    return wrapper


def _isend_wrapper(inner: Callable[..., Any]) -> Callable[..., Any]:
    """An op made with the patched ``isend`` but run after undo: the unpatched
    ``batch_isend_irecv`` takes it for a receive and passes ``group_src``; make it a send."""

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: Args, kwargs: Kwargs) -> Any:
        if "group_src" in kwargs and "group_dst" not in kwargs:
            kwargs = dict(kwargs)
            kwargs["group_dst"] = kwargs.pop("group_src")
        return inner(wrapped, instance, args, kwargs)

    return wrapper


_ADAPTERS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "batch_isend_irecv": _p2p_batch_wrapper,
    "isend": _isend_wrapper,
}


def _wrap(name: str, original: Callable[..., Any]) -> Any:
    """The one ``wrapt.FunctionWrapper`` of collective ``name`` around ``original`` (cached,
    so both namespaces hold the same object)."""
    found = _wrappers.get(id(original))
    if found is not None and found[0] is original:
        return found[1]
    wrapper = _make_wrapper(name, original)
    adapt = _ADAPTERS.get(name)
    if adapt is not None:
        wrapper = adapt(wrapper)
    proxy = wrapt.FunctionWrapper(original, wrapper)
    _wrappers[id(original)] = (original, proxy)
    return proxy


# -- install ------------------------------------------------------------------------------


def _noop() -> None:
    return None


def _count_install(delta: int) -> None:
    global _installs
    with _installs_lock:
        _installs += delta


def install() -> Callable[[], None]:
    """Time the ``torch.distributed`` collectives (those of :data:`BUFFERS` this torch has)
    until the returned undo is called.

    Installs nest: the functions are patched once and restored — the exact original objects,
    on ``torch.distributed`` and on ``distributed_c10d`` — when the last undo runs. Code that
    bound ``from torch.distributed import all_reduce`` before install keeps the unpatched
    function. Inside ``torch.compile`` tracing the original is called straight away, so
    Dynamo sees (and rewrites) the collective itself. Without ``torch.distributed`` this
    installs nothing.
    """
    if not torch.distributed.is_available():
        return _noop
    from torch.distributed import distributed_c10d as c10d

    undos: list[Callable[[], None]] = []
    for name in BUFFERS:
        for owner in (torch.distributed, c10d):
            if callable(getattr(owner, name, None)):
                undos.append(patch(owner, name, functools.partial(_wrap, name)))
    _count_install(1)
    done = False

    def undo() -> None:
        nonlocal done
        if done:
            return
        done = True
        _count_install(-1)
        for one in reversed(undos):
            one()

    return undo


# -- DDP ----------------------------------------------------------------------------------


def _hook_parent() -> PathNode:
    """Where a DDP bucket is recorded: the anchor's node, else the open region, else a
    top-level "backward"."""
    if anchor is not None:
        node = anchor()
        if node is not None:
            return node
    node = get_top().node
    if node is not ROOT:
        return node
    return registry.steps_own("backward")


def _mean_all_reduce(process_group: Any, bucket: Any) -> torch.futures.Future[Any]:
    """DDP's own gradient all-reduce: the bucket divided by the group's size, then summed
    across the group; the work's own future, whose value is a list holding the bucket (what
    :func:`timed_comm_hook`'s one callback takes the bucket out of)."""
    from torch.distributed import distributed_c10d as c10d

    buffer = bucket.buffer()
    buffer.div_(c10d.get_world_size(process_group))  # None: the default group
    work = c10d.all_reduce(buffer, group=process_group, async_op=True)
    future: torch.futures.Future[Any] = work.get_future()
    return future


# DDP checks a hook's annotations as objects, and these are strings (postponed evaluation)
_mean_all_reduce.__annotations__.clear()


#: What torch's ``Future.then`` puts before an error raised in its callback.
WRAPPED = "Got the following error when running the callback: "
# The last error a timed bucket's future completed with (the process is usually dying).
_bucket_error: list[BaseException] = []


def bucket_error(error: BaseException) -> BaseException | None:
    """The error a timed DDP bucket failed with, if ``error`` (raised by ``backward()``) is
    it as passed through the bucket's future callback; else ``None``."""
    if not _bucket_error or not str(error).startswith(WRAPPED):
        return None
    cause = _bucket_error.pop()
    return cause if str(cause) in str(error) else None


def timed_comm_hook(hook: Hook | None = None, name: str = "ddp_all_reduce") -> Hook:
    """A DDP communication hook that calls ``hook`` (default: DDP's own all-reduce, the mean
    of the bucket across the group) and times each bucket from the call until its future
    completes, with the bucket's bytes.

    The time lands under :data:`anchor`'s node if set, else the region open on the calling
    thread, else a top-level "backward"; the path is concurrent (it overlaps the backward
    pass). A failed communication reaches DDP through the future's callback, which torch's
    ``Future.then`` prefixes with :data:`WRAPPED`; the timed ``backward()`` raises the error
    itself (:func:`bucket_error`). With no :func:`install` live the hook only calls
    ``hook``. DDP takes one comm hook: to keep your own, wrap it —
    ``ddp.register_comm_hook(state, timed_comm_hook(my_hook))``.
    """
    check_name(name)
    inner = hook if hook is not None else _mean_all_reduce
    unwrap = _first if hook is None else _same

    @functools.wraps(inner)  # DDP checks the hook's signature: it sees ``inner``'s
    def timed_hook(state: Any, bucket: Any) -> torch.futures.Future[Any]:
        if not _installs:
            plain = inner(state, bucket)
            return plain if hook is not None else plain.then(lambda f: unwrap(f.value()))
        buffer = bucket.buffer()
        span = Span(name, parent=_hook_parent())
        done = _ender(span, _tensor_bytes(buffer))
        fut: torch.futures.Future[Any] = _run_inside(inner, (state, bucket), {})

        def finished(f: torch.futures.Future[Any]) -> Any:
            done()
            try:
                return unwrap(f.value())
            except Exception as error:
                _bucket_error[:] = [error]
                raise

        # chained, so that the bucket's span ends before DDP goes on with its result
        return fut.then(finished)

    return timed_hook


def _first(value: Any) -> Any:
    return value[0]


def _same(value: Any) -> Any:
    return value


def hook_ddp(model: object) -> bool:
    """Register :func:`timed_comm_hook` on a ``DistributedDataParallel`` model that has no comm
    hook yet (state: its process group); True if registered. The DDP may be held by wrappers
    (``torch.compile(ddp)``: ``_orig_mod``), which are looked through.

    DDP allows one comm hook and cannot unregister it: after the install ends the hook stays
    and only passes through to DDP's all-reduce. A model with its own hook is left alone
    (wrap yours in :func:`timed_comm_hook` instead).
    """
    if not torch.distributed.is_available():
        return False
    from torch.nn.parallel import DistributedDataParallel

    chain = held_chain(model) if isinstance(model, nn.Module) else []
    ddp = next((m for m in chain if isinstance(m, DistributedDataParallel)), None)
    if ddp is None or getattr(ddp, "_comm_hooks", None):
        return False
    try:
        ddp.register_comm_hook(ddp.process_group, timed_comm_hook())
    except RuntimeError:  # a built-in hook was registered (DDP does not list those)
        return False
    return True


def hook_enclosing_ddp(model: nn.Module) -> Callable[[], None]:
    """:func:`hook_ddp` on the ``DistributedDataParallel`` that turns out to run ``model``
    (``ddp = DDP(model)`` with ``model`` given to ``auto``): a forward pre-hook on ``model``
    looks, at its first call, at the DDP whose forward is running (DDP marks it while it
    calls the module it holds) and takes itself off. No process group, no hook. Returns
    the undo (takes the pre-hook off if it never ran)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return lambda: None
    from torch.nn.parallel import DistributedDataParallel

    def first_forward(module: nn.Module, args: Any) -> None:
        if torch.compiler.is_compiling():
            return
        handle.remove()
        active = getattr(DistributedDataParallel, "_active_ddp_module", None)
        if active is not None and any(held is module for held in held_chain(active)):
            hook_ddp(active)

    handle = model.register_forward_pre_hook(first_forward)
    return handle.remove
