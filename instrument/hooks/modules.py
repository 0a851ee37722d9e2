"""Module regions: which modules get one, what they are called, and the hooks that time them.

The root module's region is ``forward``; every other timed module is named by its attribute
path below the nearest *timed* ancestor, so a ``ModuleList`` (which never runs) joins its
index to its own name (``layers.0``), and regions nest as the calls nest
(``forward/encoder/layers.0/self_attn``). Wrappers that only hold the real module — DDP,
DataParallel, FSDP (v1), activation checkpointing, ``torch.compile`` — are timed in place of
the module they hold, and their attribute (``module.``, ``_orig_mod.``, ...) never shows.

A module's ``forward`` is timed by a method put on the instance (``remove()`` takes it off):
``nn.Module.__call__`` then keeps its no-hook fast path, where a pair of forward hooks
would cost PyTorch's hook machinery on every call (measured in docs/performance.md); an
exception inside ``forward`` still closes the region. Per-module backward uses PyTorch's
full backward hooks. Every wrapper and hook first asks ``torch.compiler.is_compiling()``:
inside a graph being compiled it does nothing, which keeps Dynamo free of graph breaks. A
compiled module is timed from outside as one region — also when it is compiled *after*
``auto``: ``torch.compile(module)`` (``OptimizedModule.__call__`` is patched while hooks
are installed) and ``module.compile()`` (``nn.Module.compile`` likewise) keep the
module's region, timing the compiled call.
"""

from __future__ import annotations

import fnmatch
import functools
import types
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from instrument import registry
from instrument._warn import warn_once
from instrument.hooks import patches, untraced
from instrument.regions.decorators import direct_call, in_region
from instrument.regions.frames import Frame, get_top, set_top
from instrument.regions.region import Region, region_for
from instrument.registry import PathNode

Pattern = str | type[nn.Module]

#: Attributes by which wrappers hold the module they wrap, and the wrappers that use them.
_HOLDERS: tuple[tuple[str, tuple[type, ...] | None], ...] = (
    ("module", (nn.parallel.DistributedDataParallel, nn.DataParallel)),
    ("_fsdp_wrapped_module", None),
    ("_checkpoint_wrapped_module", None),
    ("_orig_mod", None),
    ("_forward_module", None),  # Lightning Fabric's _FabricModule (its strategy's module)
)

compiling = torch.compiler.is_compiling

# every module timed by live hooks -> (its region, the hooks), so that compiling it later
# (torch.compile(module), module.compile()) keeps its region
_timed: weakref.WeakKeyDictionary[nn.Module, tuple[Region, ModuleHooks]] = (
    weakref.WeakKeyDictionary()
)


def timing_region(module: nn.Module) -> Region | None:
    """The region an installed ``auto`` times ``module``'s forward as, or None."""
    found = _timed.get(module)
    return None if found is None else found[0]


@dataclass(frozen=True)
class Target:
    """One module that gets a region."""

    module: nn.Module
    name: str  # the region name: "forward" for the root, else relative to the timed parent
    qualname: str  # the dotted name below the root, wrapper attributes left out ("" = root)
    compiled: bool = False  # timed as one region; nothing inside it is hooked


def held_module(module: nn.Module) -> nn.Module | None:
    """The module a transparent wrapper holds (DDP's ``module``, ``_orig_mod``, ...), or None."""
    for attr, wrappers in _HOLDERS:
        inner = module._modules.get(attr)
        if inner is not None and (wrappers is None or isinstance(module, wrappers)):
            return inner
    return None


#: Wrappers of wrappers followed at most (Fabric's module around DDP around compile(yours)).
MAX_WRAPPERS = 5


def held_chain(module: nn.Module) -> list[nn.Module]:
    """``module`` and the modules its transparent wrappers hold, outermost first
    (``[compiled, ddp, model]`` for ``torch.compile(DDP(model))``)."""
    chain = [module]
    for _ in range(MAX_WRAPPERS):
        inner = held_module(chain[-1])
        if inner is None:
            break
        chain.append(inner)
    return chain


def is_compiled(module: nn.Module) -> bool:
    """``torch.compile(module)`` (an OptimizedModule) or ``module.compile()`` in place."""
    if getattr(module, "_compiled_call_impl", None) is not None:
        return True
    return type(module).__name__ == "OptimizedModule" and hasattr(module, "_orig_mod")


def _matches(qualname: str, module: nn.Module, patterns: Sequence[Pattern]) -> bool:
    for pattern in patterns:
        if isinstance(pattern, str):
            if fnmatch.fnmatchcase(qualname, pattern):
                return True
        elif isinstance(module, pattern):
            return True
    return False


def check_patterns(patterns: object, option: str) -> tuple[Pattern, ...] | None:
    """Validate ``include=`` / ``exclude=``: None, a glob, a module type, or a list of them."""
    if patterns is None:
        return None
    items: Iterable[object] = (
        (patterns,) if isinstance(patterns, (str, type)) else patterns  # type: ignore[assignment]
    )
    try:
        out = tuple(items)
    except TypeError:
        raise TypeError(
            f"{option} must be a glob string, an nn.Module subclass or a list of them, "
            f"got {patterns!r}"
        ) from None
    checked: list[Pattern] = []
    for item in out:
        if not (isinstance(item, str) or (isinstance(item, type) and issubclass(item, nn.Module))):
            raise TypeError(
                f"{option} entries must be glob strings (matched against names like "
                f"'encoder.layers.0') or nn.Module subclasses, got {item!r}"
            )
        checked.append(item)
    return tuple(checked)


def plan(
    model: nn.Module,
    *,
    depth: int | None = None,
    include: Pattern | Iterable[Pattern] | None = None,
    exclude: Pattern | Iterable[Pattern] | None = None,
) -> list[Target]:
    """The modules of ``model`` that get a region, parents before children.

    ``depth`` limits how many levels below ``forward`` are timed (0: only ``forward``).
    ``include`` / ``exclude`` are glob patterns on the dotted name (``"encoder.layers.*"``,
    ``"*.dropout"``) or module types; a match also covers everything below the module. The
    root is always timed. A module reachable twice (shared) is timed once, by its first name.
    """
    include = check_patterns(include, "include")
    exclude = check_patterns(exclude, "exclude")
    targets = [Target(model, "forward", "", is_compiled(model))]
    if targets[0].compiled:
        return targets
    seen = {id(model)}

    def visit(
        module: nn.Module, qual: str, rel: str, level: int, included: bool
    ) -> Iterator[Target]:
        chain = held_chain(module)  # the wrapped module's children, past every wrapper
        seen.update(id(held) for held in chain[1:])
        for attr, child in chain[-1].named_children():
            if child is None or id(child) in seen or isinstance(child, torch.jit.ScriptModule):
                continue  # a TorchScript child runs no Python hooks: part of its parent
            seen.add(id(child))
            child_qual = f"{qual}.{attr}" if qual else attr
            child_rel = f"{rel}.{attr}" if rel else attr
            if exclude and _matches(child_qual, child, exclude):
                continue
            child_included = included or bool(include and _matches(child_qual, child, include))
            runs = not isinstance(child, (nn.ModuleList, nn.ModuleDict))
            timed = runs and child_included and (depth is None or level < depth)
            if timed:
                compiled = is_compiled(child)
                yield Target(child, child_rel, child_qual, compiled)
                if not compiled:
                    yield from visit(child, child_qual, "", level + 1, child_included)
            elif depth is None or level < depth:
                yield from visit(child, child_qual, child_rel, level, child_included)

    targets.extend(visit(model, "", "", 0, include is None))
    return targets


class ModuleHooks:
    """Forward regions (and, with ``backward_modules``, per-module backward regions) on the
    planned modules; :meth:`remove` takes every hook off again."""

    def __init__(
        self,
        targets: Sequence[Target],
        *,
        clock: object = None,
        backward_modules: bool = False,
        backward_anchor: Callable[[], PathNode] | None = None,
    ) -> None:
        #: module -> its backward hooks' handles (``backward="modules"``)
        self._backward: dict[nn.Module, list[RemovableHandle]] = {}
        #: modules seen running compiled (their backward hooks are off)
        self._compiled: weakref.WeakSet[nn.Module] = weakref.WeakSet()
        self._restore: list[Callable[[], None]] = []
        self._anchor = backward_anchor or (lambda: registry.steps_own("backward"))
        #: (module, its C forward, the Python twin) while the C one is in place
        self._untraced: list[tuple[nn.Module, object, object]] = []
        #: the functions put on modules (timed forwards, backward hooks), by id
        self._functions: dict[int, object] = {}
        #: id of a timed forward's function -> (its module, the instance ``forward`` it
        #: replaced or None)
        self._replaced: dict[int, tuple[nn.Module, object]] = {}
        self._restore.append(
            patches.patch(nn.Module, "__setstate__", _untimed_copies, inert_when_left=True)
        )
        self._restore.append(
            patches.patch(nn.Module, "_replicate_for_data_parallel", _untimed_replicas)
        )
        backward_regions: dict[str, Region] = {}  # qualname -> region, of backward-timed ones
        for target in targets:
            region = region_for(target.name, clock)
            if target.compiled and getattr(target.module, "_compiled_call_impl", None):
                self._time_compiled_in_place(target.module, region)
                continue
            self._time_forward(target.module, region)
            if not target.compiled:
                _timed[target.module] = (region, self)
            if backward_modules and target.qualname and not target.compiled:
                self._time_backward(
                    target.module, region, _ancestors(target.qualname, backward_regions)
                )
                backward_regions[target.qualname] = region
        if self._untraced:
            self._restore.append(untraced.until_traced(self._make_traceable))

    def _time_forward(self, module: nn.Module, region: Region) -> None:
        """Put a timed ``forward`` on the instance: ``nn.Module.__call__`` then keeps its
        no-hook fast path (PyTorch's hook machinery alone costs several µs per call). It is
        a method bound to the module, so ``copy.deepcopy`` (an EMA copy) rebinds it. While
        nothing is compiled the method's function is the C timed call itself; its Python
        twin, which Dynamo can trace, takes its place at the first compilation
        (:mod:`~instrument.hooks.untraced`)."""
        own = module.__dict__.get("forward")
        call = own if own is not None else type(module).forward
        bound_own = own is not None
        c_call = direct_call(call, region)  # C: the region entered and left in one call
        timed_call = c_call if c_call is not None else in_region(call, region)

        @_wraps(call)
        def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            if compiling():  # Dynamo traces this branch: no graph break
                return call(*args, **kwargs) if bound_own else call(self, *args, **kwargs)
            return timed_call(*args, **kwargs) if bound_own else timed_call(self, *args, **kwargs)

        self._own(forward, c_call)
        for function in (forward, c_call):
            if function is not None:
                self._replaced[id(function)] = (module, own)
        traceable = types.MethodType(forward, module)
        fast = None
        if c_call is not None and not bound_own and untraced.c_hooks_allowed():
            fast = types.MethodType(c_call, module)
            self._untraced.append((module, fast, traceable))
        module.__dict__["forward"] = traceable if fast is None else fast

        def restore() -> None:
            current = module.__dict__.get("forward")
            if current in (traceable, fast):
                if bound_own:
                    module.__dict__["forward"] = own
                else:
                    del module.__dict__["forward"]
            elif _wraps_one_of(current, (forward, c_call)):
                warn_once(
                    "auto:forward-buried",
                    f"instrument: the forward of this {type(module).__name__} was wrapped "
                    "after instrument.auto() timed it (accelerate's prepare() with mixed "
                    "precision does this), so remove() cannot take the timing out from under "
                    "that wrapper and its calls are still recorded; call auto() after "
                    "prepare()",
                    stacklevel=5,
                )

        self._restore.append(restore)

    def _make_traceable(self) -> None:
        """Dynamo is about to compile: the Python twin of every C forward takes its place."""
        untraced_forwards, self._untraced = self._untraced, []
        for module, fast, traceable in untraced_forwards:
            if module.__dict__.get("forward") is fast:
                module.__dict__["forward"] = traceable

    def _time_compiled_in_place(self, module: nn.Module, region: Region) -> None:
        """``module.compile()`` compiles the hooks too: time its compiled call from outside."""
        compiled_call = module._compiled_call_impl

        def call(*args: Any, **kwargs: Any) -> Any:
            if compiling():
                return compiled_call(*args, **kwargs)  # type: ignore[misc]
            with region:
                return compiled_call(*args, **kwargs)  # type: ignore[misc]

        module._compiled_call_impl = call

        def restore() -> None:
            if module._compiled_call_impl is call:
                module._compiled_call_impl = compiled_call

        self._restore.append(restore)

    def _time_backward(
        self, module: nn.Module, region: Region, ancestors: Sequence[Region]
    ) -> None:
        """Each module's backward region sits at its forward path below ``backward``
        (``ancestors``: the regions of the timed modules above it, outermost first). Where
        its parent's region is not the open one — autograd's own threads have none open; a
        parent none of whose inputs need a gradient gets its backward hooks together, before
        its children run; branches interleave — the region is opened below the parent's
        node, found from the ``backward`` region's node down by name."""
        anchor_of = self._anchor
        parent = ancestors[-1] if ancestors else None

        def enter(mod: nn.Module, grad_output: Any) -> None:
            if compiling():
                return
            top = get_top()
            if parent is not None and top.owner is parent:
                region.__enter__()
                return
            node = anchor_of()
            for above in ancestors:
                node = node.child(above.name, above.level, above.mode or "cpu")
            if top.node is not node:
                frame = Frame(node, 0, top, anchor_of, None)
                set_top(frame)
            region.__enter__()

        def leave(mod: nn.Module, grad_input: Any, grad_output: Any) -> None:
            if compiling():
                return
            region.__exit__(None, None, None)
            top = get_top()
            if top.owner is anchor_of:
                set_top(top.parent)

        self._own(enter, leave)
        self._backward[module] = [
            module.register_full_backward_pre_hook(enter),
            module.register_full_backward_hook(leave),
        ]

    def compiled(self, module: nn.Module) -> None:
        """``module`` runs compiled: take the per-module backward hooks off it and the
        modules below it. Dynamo breaks the graph at every module with backward hooks
        ("require compiled autograd"), which fell back to eager at its recompile limit.
        Called at every compiled call: the module tree is walked once per module."""
        if not self._backward or module in self._compiled:
            return
        self._compiled.add(module)
        dropped = False
        for inner in module.modules():
            for handle in self._backward.pop(inner, ()):
                handle.remove()
                dropped = True
        if dropped:
            warn_once(
                "auto:backward-compiled",
                f"instrument: {type(module).__name__} runs compiled, so its modules have no "
                'backward="modules" lines (PyTorch breaks the graph at every module with '
                "backward hooks); its backward is timed within 'backward'",
                stacklevel=4,
            )

    def _own(self, *functions: object) -> None:
        for function in functions:
            if function is not None:
                self._functions[id(function)] = function
                _owners[id(function)] = self

    def remove(self) -> None:
        """Take every hook off and undo every in-place patch (idempotent). (Copies of timed
        modules are untimed as they are made: :func:`_untimed_copies`.)"""
        backward, self._backward = self._backward, {}
        for handles in backward.values():
            for handle in handles:
                handle.remove()
        restore, self._restore = self._restore, []
        for undo in reversed(restore):
            undo()
        for module in [m for m, (_, hooks) in list(_timed.items()) if hooks is self]:
            _timed.pop(module, None)
        for key in self._functions:
            if _owners.get(key) is self:
                del _owners[key]
        self._replaced = {}

    def _untime_copy(self, copied: nn.Module) -> None:
        """Take this handle's timed ``forward`` and backward hooks off a copy of a module."""
        ours = self._functions
        self._untime_forward(copied)
        for hooks in (copied._backward_pre_hooks, copied._backward_hooks):
            for key in [k for k, hook in hooks.items() if id(hook) in ours]:
                del hooks[key]

    def _untime_forward(self, copied: nn.Module) -> None:
        """Put back on a copy of a timed module the ``forward`` the module had before it was
        timed (its own instance ``forward``, bound to the copy, or the class's)."""
        forward = vars(copied).get("forward")
        if _owner_of(forward) is not self:
            return
        module, own = self._replaced[id(getattr(forward, "__func__", None))]
        if own is None:
            del vars(copied)["forward"]
        elif isinstance(own, types.MethodType) and own.__self__ is module:  # its own method
            vars(copied)["forward"] = types.MethodType(own.__func__, copied)
        else:
            vars(copied)["forward"] = own

    def watch_compile(self) -> None:
        """Keep timing modules compiled after this point (see the module doc)."""
        from torch._dynamo.eval_frame import OptimizedModule

        # some torch releases (2.6) define no OptimizedModule.__call__: it is nn.Module's
        self._restore.append(
            patches.patch(OptimizedModule, "__call__", _optimized_call, inherited=True)
        )
        self._restore.append(patches.patch(nn.Module, "compile", _compile_in_place))


#: id of a function put on modules (a timed forward, a backward hook) -> its hooks
_owners: dict[int, ModuleHooks] = {}


def _owner_of(forward: object) -> ModuleHooks | None:
    """The hooks whose timed ``forward`` this (bound) method is, if any."""
    return _owners.get(id(getattr(forward, "__func__", None)))


def _untimed_copies(original: Callable[..., Any]) -> Callable[..., Any]:
    """``nn.Module.__setstate__`` (run by ``copy.deepcopy`` and unpickling) that takes the
    timing off a copy of a timed module as it is made. A copy (an EMA model,
    ``torch.optim.swa_utils.AveragedModel``) was timed under its original's names: its
    evaluation forwards counted as training's ``forward``. Now it is what a copy made
    before ``auto`` is: untimed (its time stays in its parent region, or ``(other)``)."""

    @functools.wraps(original)
    def __setstate__(self: nn.Module, state: Any) -> Any:
        result = original(self, state)
        forward = vars(self).get("forward")
        hooks = _owner_of(forward)
        if hooks is not None and getattr(forward, "__self__", None) is self:
            hooks._untime_copy(self)
        return result

    return __setstate__


def compiled_over_timing(module: nn.Module) -> bool:
    """Whether ``module``'s instance ``forward`` is a function ``torch.compile`` made of
    instrument's timed forward (``model.forward = torch.compile(model.forward)`` after
    ``auto``): Dynamo traces through the timing, so the call records nothing."""
    inner = getattr(vars(module).get("forward"), "_torchdynamo_orig_callable", None)
    return _owner_of(inner) is not None


def _untimed_replicas(original: Callable[..., Any]) -> Callable[..., Any]:
    """``nn.Module._replicate_for_data_parallel`` whose replica runs its own ``forward``
    untimed. ``nn.DataParallel`` on several devices copies each module's ``__dict__`` into
    a replica: the timed ``forward``, bound to the original module, ran the original's
    weights on every device (a device-mismatch error, or the wrong weights). The replicas
    run in DataParallel's threads, where their regions would have no parent: the wrapper's
    own region times the whole parallel forward. (The backward hooks are shared by the
    shallow copy and left alone.)"""

    @functools.wraps(original)
    def _replicate_for_data_parallel(self: nn.Module) -> nn.Module:
        replica = original(self)
        hooks = _owner_of(vars(replica).get("forward"))
        if hooks is not None:
            hooks._untime_forward(replica)
        return replica  # type: ignore[no-any-return]

    return _replicate_for_data_parallel


def _optimized_call(original: Callable[..., Any]) -> Callable[..., Any]:
    """``OptimizedModule.__call__`` that times the compiled call as the wrapped module's
    region when that module is timed (``torch.compile`` after ``auto``)."""

    @functools.wraps(original)
    def __call__(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        untraced.make_traceable()
        inner = self._modules.get("_orig_mod")
        if inner is None or compiling():
            return original(self, *args, **kwargs)
        found = _timed.get(inner)
        if found is None or get_top().owner is found[0]:
            return original(self, *args, **kwargs)
        found[1].compiled(inner)
        with found[0]:
            return original(self, *args, **kwargs)

    return __call__


def _compile_in_place(original: Callable[..., Any]) -> Callable[..., Any]:
    """``nn.Module.compile`` that keeps timing a timed module's compiled call."""

    @functools.wraps(original)
    def compile(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        untraced.make_traceable()
        result = original(self, *args, **kwargs)
        found = _timed.get(self)
        if found is not None:
            found[1].compiled(self)
            found[1]._time_compiled_in_place(self, found[0])
        return result

    return compile


def _wraps(call: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``functools.wraps(call)`` without the attributes Dynamo leaves on a function it
    compiled in place (Lightning's ``forward = dynamo_ctx(forward)``): copied onto the timed
    ``forward``, they made Dynamo take it for that compiled function and bind ``self`` twice."""

    def wrap(forward: Callable[..., Any]) -> Callable[..., Any]:
        functools.update_wrapper(forward, call, updated=())
        marks = getattr(call, "__dict__", {})
        vars(forward).update((k, v) for k, v in marks.items() if not k.startswith("_torchdynamo"))
        return forward

    return wrap


def _wraps_one_of(call: object, inner: tuple[object, ...], depth: int = 8) -> bool:
    """Whether ``call`` is a wrapper (``__func__`` of a method, ``__wrapped__`` of a
    ``functools.wraps`` function) around one of ``inner``, down to ``depth`` layers."""
    for _ in range(depth):
        if call is None:
            return False
        if any(call is one for one in inner if one is not None):
            return True
        call = getattr(call, "__func__", None) or getattr(call, "__wrapped__", None)
    return False


def _ancestors(qualname: str, timed: dict[str, Region]) -> list[Region]:
    """The regions in ``timed`` (by dotted name) of the modules above ``qualname``,
    outermost first."""
    parts = qualname.split(".")
    return [timed[name] for i in range(1, len(parts)) if (name := ".".join(parts[:i])) in timed]
