"""The ``optimizer`` and ``zero_grad`` regions, and the end of an iteration.

``optimizer.step()`` is timed by ``step`` on the optimizer's instance (:func:`_guard`), and,
for a step that does not pass through it (a ``step`` bound before ``auto``, the class's
called directly), by the optimizer's step pre/post hooks, which stand aside while the guard
runs. The *ticking* optimizer's step (the last one given) then ends the iteration — so with
gradient accumulation an iteration is one optimizer step. A step that raises closes its
region (recorded, like any region that raised; the iteration does not end) and the
exception propagates unchanged (PyTorch runs no post hook then). In a compiled step the
hooks time it, outside the graph (:mod:`instrument.hooks.eager`), so a compiled
``optimizer.step()`` is timed like an eager one and ends the iteration.
``GradScaler.step(optimizer)`` is timed whole (unscaling and the inf check included) and
ends the iteration even when the scaler skips the step because of infs or NaNs; the
skipped steps are counted.

``optimizer.step(closure)`` (LBFGS, Lightning, any user code) runs forward and backward
*inside* the step. The guard (or the pre hook) hands the optimizer a wrapped closure:
while it runs, the ``optimizer`` frame is taken off the region stack, so the closure's
``forward``, ``backward`` and ``zero_grad`` are recorded at the paths they have in a plain
loop; when it returns, the frame goes back with its start moved later by the closure's
duration, so the one ``optimizer`` record per step is the update alone. On the "cuda" clock
the frame's start event is re-recorded after each closure call (so the device time is the
update after the last closure call: all of it for torch's optimizers, which call the
closure first); on "sync" the device is synchronized at both ends of the closure.
"""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import wrapt

from instrument import clocks, observe
from instrument.hooks import eager, patches
from instrument.hooks.eager import outside
from instrument.regions import native
from instrument.regions.decorators import decorate
from instrument.regions.frames import Frame, abandon, close, get_top, set_top
from instrument.regions.region import region_for

# True only while Dynamo traces the caller (a compiled optimizer step)
tracing = torch.compiler.is_dynamo_compiling

# optimizer -> its hooks (what the GradScaler patch consults)
_tracked: weakref.WeakKeyDictionary[torch.optim.Optimizer, OptimizerHooks] = (
    weakref.WeakKeyDictionary()
)


def inner_optimizer(optimizer: object) -> torch.optim.Optimizer | None:
    """The ``torch.optim.Optimizer`` that ``optimizer`` is or delegates to, or None.

    Wrappers such as Accelerate's ``AcceleratedOptimizer`` or Lightning's
    ``LightningOptimizer`` hold the real optimizer as ``.optimizer`` / ``._optimizer`` and
    pass ``isinstance(..., Optimizer)`` without being the object that steps (no hooks of
    their own, or a copy of the real one's attributes): they are followed down to it.
    """
    seen: set[int] = set()
    current = optimizer
    while id(current) not in seen:
        seen.add(id(current))
        for attr in ("optimizer", "_optimizer"):  # a wrapper first, even one sharing state
            inner = vars(current).get(attr) if hasattr(current, "__dict__") else None
            if isinstance(inner, torch.optim.Optimizer) and inner is not current:
                current = inner
                break
        else:
            if isinstance(current, torch.optim.Optimizer) and "_optimizer_step_pre_hooks" in vars(
                current
            ):
                return current
            return None
    return None


def given_optimizers(optimizer: object) -> list[tuple[object, torch.optim.Optimizer]]:
    """``None``, one optimizer or a sequence of them → each object given with the real
    optimizer it is or holds (wrappers followed with :func:`inner_optimizer`); ``TypeError``
    for anything else."""
    if optimizer is None:
        return []
    single = isinstance(optimizer, torch.optim.Optimizer) or inner_optimizer(optimizer)
    items = [optimizer] if single else optimizer
    try:
        out = list(items)  # type: ignore[call-overload]
    except TypeError:
        out = [optimizer]
    checked: list[tuple[object, torch.optim.Optimizer]] = []
    for item in out:
        inner = inner_optimizer(item)
        if inner is None:
            raise TypeError(
                "optimizer must be a torch.optim.Optimizer (or a wrapper holding one as "
                f".optimizer, like Accelerate's AcceleratedOptimizer) or a list of them, "
                f"got {type(item).__name__}"
            )
        checked.append((item, inner))
    return checked


class OptimizerHooks:
    """Times ``step()`` and ``zero_grad()`` of some optimizers and calls ``on_step`` after
    the last one's step (the end of an iteration)."""

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        on_step: Callable[[], object],
        *,
        clock: object = None,
        wrappers: Sequence[tuple[object, torch.optim.Optimizer]] = (),
    ) -> None:
        self.skipped_steps = 0
        self._region = region_for("optimizer", clock)
        #: Called after the ticking optimizer's step; may be replaced (``auto``'s first-steps
        #: check hands over to the reporter's tick this way).
        self.on_step = on_step
        self._ticker = optimizers[-1] if optimizers else None
        self._scaled = False  # inside a whole step (GradScaler.step...): it times and ticks
        self._stepped = False
        # the versions run outside Dynamo: the hooks' for a traced step, the tick's for a
        # step run between the graphs of a compiled function (see hooks.eager)
        self._pre_outside = outside(self._pre)
        self._post_outside = outside(self._post)
        self._tick_outside = outside(self._tick)
        self._undo: list[Callable[[], None]] = []
        zero_grad = region_for("zero_grad", clock)
        for opt in optimizers:
            if opt in _tracked:
                raise RuntimeError(
                    f"instrument.auto is already timing this {type(opt).__name__}; "
                    "call remove() on the first handle before installing again"
                )
            _tracked[opt] = self
            call = _Call()
            pre = native.stand_aside(call, functools.partial(self._pre, call))
            post = native.stand_aside(call, functools.partial(self._post, call))
            self._undo.append(opt.register_step_pre_hook(pre).remove)
            self._undo.append(opt.register_step_post_hook(post).remove)
            self._undo.append(patches.put_on_instance(opt, "step", _guard(opt, call, self)))
            timed_zero_grad = decorate(opt.zero_grad, zero_grad)
            self._undo.append(patches.put_on_instance(opt, "zero_grad", timed_zero_grad))
            self._undo.append(_forget(opt))
        for wrapper, inner in wrappers:
            # a wrapper whose class takes zero_grad from the optimizer's class (Lightning
            # Fabric's) runs it on itself, past the timed one on the optimizer's instance
            if (
                wrapper is not inner
                and inner in _tracked
                and getattr(type(wrapper), "zero_grad", None) is type(inner).zero_grad
                and hasattr(wrapper, "__dict__")
                and "zero_grad" not in vars(wrapper)
            ):
                self._undo.append(
                    patches.put_on_instance(wrapper, "zero_grad", vars(inner)["zero_grad"])
                )
        if optimizers:
            self._undo.append(patches.patch(torch.amp.GradScaler, "step", _make_scaler_step))

    def _pre(self, call: _Call, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        if call.guarded or self._scaled:  # the guard times this step, or GradScaler.step
            return None
        if tracing():  # a compiled step: this hook runs outside the graph (hooks.eager)
            return self._pre_outside(call, optimizer, args, kwargs)
        region = self._region
        if get_top().owner is region:
            if call.running and call.entered:
                # torch runs the hooks again when a subclass's step() calls super().step():
                # one region, one step (and its closure is timed already)
                call.nested += 1
                return None
            abandon(region)  # a step that raised outside its guard: no post hook ran
        region.__enter__()
        call.entered = True
        if not kwargs and len(args) < 2:  # step(): no closure
            return None
        timed = self._timed_closure_args(args[1:], kwargs)  # args: (optimizer, closure?, ...)
        return None if timed is None else ((args[0], *timed[0]), timed[1])

    def _timed_closure_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``step()``'s arguments with its closure timed (:meth:`_time_closure`), or None
        when it was given none."""
        if args and callable(args[0]):
            return (self._time_closure(args[0]), *args[1:]), kwargs
        closure = kwargs.get("closure")
        if callable(closure):
            return args, {**kwargs, "closure": self._time_closure(closure)}
        return None

    def _raised(self, error: BaseException) -> None:
        """``step()`` raised past its post hook: close the region its pre hook opened."""
        if get_top().owner is self._region:
            self._region.__exit__(type(error), error, error.__traceback__)

    def _hooked_step(
        self, call: _Call, run: Callable[..., Any], optimizer: Any, args: Any, kwargs: Any
    ) -> Any:
        """A step the step hooks time (see :func:`_guard`): ``run(optimizer, args,
        kwargs)`` with ``call`` kept, the region closed if it raises."""
        outermost = not call.running
        if outermost:
            call.running, call.entered, call.nested = True, False, 0
        try:
            return run(optimizer, args, kwargs)
        except BaseException as error:
            if outermost:
                call.nested = 0
                self._raised(error)
            raise
        finally:
            if outermost:
                call.running = False

    def _end_iteration(self) -> None:
        """After the ticking optimizer's step: ``on_step`` (kept out of Dynamo when this
        runs between the graphs of a compiled function)."""
        if eager.compile_callback() is None:
            self.on_step()
        else:
            self._tick_outside()

    def _time_closure(self, closure: Callable[..., Any]) -> Callable[..., Any]:
        """``closure``, run with the ``optimizer`` frame set aside (see the module doc)."""
        region = self._region

        def timed_closure(*args: Any, **kwargs: Any) -> Any:
            frame = get_top()
            if frame.owner is not region:  # optimizer not timed (disabled), or called elsewhere
                return closure(*args, **kwargs)
            sync = region.mode == "sync"
            if sync:
                clocks.synchronize()
            set_top(frame.parent)
            now = region._now
            t0 = now()
            try:
                result = closure(*args, **kwargs)
            except BaseException:
                # the step ends here: record the update's time so far, leave the stack clean
                set_top(resumed(frame, now() - t0, sync))
                close(get_top())
                raise
            set_top(resumed(frame, now() - t0, sync))
            return result

        return timed_closure

    def _post(self, call: _Call, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if call.guarded:
            return
        if self._scaled:
            self._stepped = True
            return
        if tracing():
            self._post_outside(call, optimizer, args, kwargs)
            return
        if call.nested:  # the hooks of a super().step() (see _pre)
            call.nested -= 1
            return
        self._region.__exit__(None, None, None)
        if optimizer is self._ticker:
            self._end_iteration()

    def _tick(self) -> None:
        self.on_step()

    def whole_step(
        self, optimizer: torch.optim.Optimizer, call: Callable[..., Any], args: Any, kwargs: Any
    ) -> Any:
        """A step that wraps ``optimizer``'s (``GradScaler.step(optimizer)``, a DeepSpeed
        engine's ``step()``): time it whole, the optimizer's own hooks standing aside; end
        the iteration even if it skipped the update (counted)."""
        if self._scaled or get_top().owner is self._region:
            return call(*args, **kwargs)
        self._scaled, self._stepped = True, False
        try:
            with self._region:
                result = call(*args, **kwargs)
        finally:
            self._scaled = False
        if not self._stepped:
            self.skipped_steps += 1
        if optimizer is self._ticker:
            self.on_step()
        return result

    def remove(self) -> None:
        """Take every hook and patch off (idempotent)."""
        undo, self._undo = self._undo, []
        for step in reversed(undo):
            step()


def resumed(frame: Frame, spent: int, sync: bool) -> Frame:
    """``frame`` back on top of its parent, its start moved later by ``spent`` ns."""
    if sync:
        clocks.synchronize()
    node, t0, parent, owner, event = frame
    if event is not None:  # the device pair restarts after the closure
        clocks.events.release(torch.cuda.current_device(), [event])
        event = clocks.record_event()
    if observe.open_ranges:
        opened = observe.open_ranges.pop((node, t0), None)
        if opened is not None:
            observe.open_ranges[(node, t0 + spent)] = opened
    return Frame(node, t0 + spent, parent, owner, event)


class _PyCall:
    """One optimizer's ``step()`` call, as its guard sees it: running, timed by the guard
    itself, whether the pre hook has opened the region in it, and how many nested runs of
    the hooks are open. (With C, ``speedups.StepCall``: the same fields, read in place by the
    C guard and step hooks; the flags take bools.)"""

    __slots__ = ("entered", "guarded", "nested", "running")

    def __init__(self) -> None:
        self.running = False
        self.guarded = False
        self.entered = False
        self.nested = 0


if TYPE_CHECKING:
    _Call = _PyCall
else:
    _Call = native.step_call(_PyCall)


def _guard(opt: torch.optim.Optimizer, call: _Call, hooks: OptimizerHooks) -> types.MethodType:
    """``opt.step``, which times the step itself: the ``optimizer`` region around the call,
    the closure timed, the region closed (recorded as raised) if the step raises, then the
    iteration ended; the step hooks stand aside while it runs. Nested, compiled (Dynamo
    traces this) or inside ``GradScaler.step``, the hooks time the step instead
    (:meth:`OptimizerHooks._hooked_step`). With C, a plain eager step is one C call
    (``StepGuard``, :func:`instrument.regions.native.step_guard`), which hands every other
    call to the Python ``step`` below.

    It calls what ``opt.step`` was when guarded: the instance's own ``step`` if it had one
    (an LR scheduler's wrapper), else the class's, looked up at call time. A bound method,
    so an LR scheduler created later can wrap it (torch's takes ``opt.step.__func__``)."""
    own = vars(opt).get("step")
    region = hooks._region

    def run(self: torch.optim.Optimizer, args: Any, kwargs: Any) -> Any:
        if own is None:
            return type(self).step(self, *args, **kwargs)
        return own(*args, **kwargs)

    def step(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        if call.running or hooks._scaled or tracing():
            return hooks._hooked_step(call, run, self, args, kwargs)
        call.running = call.guarded = True
        try:
            if args or kwargs:
                timed = hooks._timed_closure_args(args, kwargs)
                if timed is not None:
                    args, kwargs = timed
            if get_top().owner is region:
                abandon(region)  # a step that raised outside its guard: no post hook ran
            region.__enter__()
            try:
                result = run(self, args, kwargs)
            except BaseException as error:
                hooks._raised(error)
                raise
        finally:
            call.running = call.guarded = False
        region.__exit__(None, None, None)
        if self is hooks._ticker:
            hooks._end_iteration()
        return result

    if own is not None:  # what torch's LR scheduler marks its wrapper with, and the like
        step.__dict__.update(getattr(own, "__dict__", {}))
    # with C: one call that does what ``step`` does in a plain eager step
    fast = native.step_guard(step, region, call, hooks, own, eager.compile_callback)
    return types.MethodType(fast, opt)


def _forget(opt: torch.optim.Optimizer) -> Callable[[], None]:
    """The undo that forgets ``opt`` in the GradScaler lookup."""

    def forget() -> None:
        _tracked.pop(opt, None)

    return forget


def _make_scaler_step(original: Callable[..., Any]) -> Any:
    def scaler_step(wrapped: Callable[..., Any], scaler: Any, args: Any, kwargs: Any) -> Any:
        optimizer = args[0] if args else kwargs.get("optimizer")
        hooks = _tracked.get(optimizer) if optimizer is not None else None
        if hooks is None or tracing():
            return wrapped(*args, **kwargs)
        return hooks.whole_step(optimizer, wrapped, args, kwargs)

    return wrapt.FunctionWrapper(original, scaler_step)
