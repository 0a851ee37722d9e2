"""A DeepSpeed engine's own ``backward()`` and ``step()``, timed whole.

``engine.backward(loss)`` scales the loss, runs autograd and reduces the gradients (with
ZeRO, into their partitions); ``engine.step()`` at an accumulation boundary clips, steps
the optimizer the engine wraps and brings the parameters back (with ZeRO, copies and
gathers). Timed only at autograd and at the torch optimizer inside, that work read as
``(other)``: half of a ZeRO-2 step on CPU. So ``backward`` is the engine's whole
``backward()`` (autograd's call inside it is the same region, not a second one, and the
gradient collectives land below it), and ``optimizer`` is the engine's whole ``step()`` at
a boundary, which ends the iteration even when the engine skips the update (an fp16
overflow: counted like ``GradScaler``'s skipped steps). A micro-step's ``step()``, which
updates nothing, is left untimed.

Nothing here imports DeepSpeed: an engine is recognised by its class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from instrument._warn import warn_once
from instrument.hooks import patches
from instrument.hooks.optim import inner_optimizer

if TYPE_CHECKING:
    import torch

    from instrument.hooks.optim import OptimizerHooks


def is_engine(model: object) -> bool:
    """Whether ``model`` is a DeepSpeed engine (``DeepSpeedEngine`` or a subclass)."""
    return any(
        cls.__name__ == "DeepSpeedEngine" and cls.__module__.startswith("deepspeed.")
        for cls in type(model).__mro__
    )


def engine_optimizer(engine: object) -> Any:
    """The optimizer the engine steps (``engine.optimizer``: a torch optimizer, or DeepSpeed's
    wrapper holding one), or None: it has none, or one that holds no torch optimizer (said
    once: then nothing ends the steps but ``instrument.step()``)."""
    found = getattr(engine, "optimizer", None)
    if found is None or inner_optimizer(found) is not None:
        return found
    warn_once(
        f"deepspeed:{type(found).__name__}",
        f"instrument: the DeepSpeed engine's optimizer ({type(found).__name__}) holds no "
        "torch.optim.Optimizer, so auto() cannot end a step at its updates; call "
        "instrument.step() after engine.step()",
        stacklevel=None,
    )
    return None


def time_step(
    engine: Any, hooks: OptimizerHooks, optimizer: torch.optim.Optimizer
) -> Callable[[], None]:
    """Time ``engine.step()`` at each accumulation boundary as the ``optimizer`` region that
    ends the iteration (``optimizer`` is the torch optimizer it steps); returns the undo."""
    original = engine.step

    def step(*args: Any, **kwargs: Any) -> Any:
        if not engine.is_gradient_accumulation_boundary():
            return original(*args, **kwargs)  # a micro-step: no update
        return hooks.whole_step(optimizer, original, args, kwargs)

    return patches.put_on_instance(engine, "step", step)
