"""Throughput over exactly the interval of the timers: steps/s, samples/s, tokens/s,
TFLOP/s and MFU.

The reporter adds up, per interval, the steps' times (between ticks) and the samples and
tokens counted for them (``instrument.step(samples=, tokens=)`` or ``instrument.count(...)``),
as the steps end: a flush reads four numbers. The first ``warmup`` steps of the run
(compilation, cuDNN autotuning, allocator warm-up) are left out of the rates but not out
of the timers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch

from instrument._frozen import made


@dataclass(frozen=True)
class Throughput:
    """Rates over the interval's counted (post-warm-up) steps. ``None`` means unknown —
    nothing counted, no FLOP count, or no known peak — never a made-up number.

    ``tflops`` is per device (this process's FLOPs per step over its step time), and
    ``mfu`` is ``tflops`` over the device's peak for the chosen dtype.
    """

    steps: int  # steps counted (the interval's steps minus warm-up ones)
    seconds: float  # their total time
    samples: int | None = None
    tokens: int | None = None
    steps_per_sec: float | None = None
    samples_per_sec: float | None = None
    tokens_per_sec: float | None = None
    flops_per_step: float | None = None
    tflops: float | None = None
    peak_tflops: float | None = None
    mfu: float | None = None
    warmup_steps: int = 0  # steps of this interval skipped as warm-up

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict; :meth:`from_dict` restores it exactly."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Throughput:
        """Inverse of :meth:`to_dict`; ``ValueError`` for a value that is not a number
        (or ``None`` where one may be unknown)."""
        values: dict[str, Any] = {}
        for key in cls.__dataclass_fields__:
            if key not in data:
                continue
            value = data[key]
            if value is None and key not in _ALWAYS_KNOWN:
                values[key] = None
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"throughput.{key} must be a number, got {value!r}")
            else:
                values[key] = int(value) if key in _COUNTS else float(value)
        return cls(**values)


_COUNTS = frozenset({"steps", "samples", "tokens", "warmup_steps"})
_ALWAYS_KNOWN = frozenset({"steps", "seconds", "warmup_steps"})


def compute(
    steps: int,
    step_ns: int,
    *,
    samples: int | None,
    tokens: int | None,
    warmup_steps: int,
    flops_per_step: float | None,
    peak_flops: float | None,
) -> Throughput | None:
    """Throughput of one interval: ``steps`` counted steps (past warm-up) that took
    ``step_ns`` together and consumed ``samples`` and ``tokens`` (None: none counted), after
    ``warmup_steps`` skipped ones. ``None`` when the interval has no step at all."""
    if not steps and not warmup_steps:
        return None
    seconds = step_ns / 1e9
    flops = None if flops_per_step is None or not steps else flops_per_step * steps
    timed = seconds > 0.0  # (the rates inline: a flush computes them every interval)
    flop_rate = flops / seconds if flops is not None and timed else None
    tflops = None if flop_rate is None else flop_rate / 1e12
    mfu = None if flop_rate is None or not peak_flops else flop_rate / peak_flops
    return made(  # without the frozen dataclass's per-field setattr
        Throughput,
        {
            "steps": steps,
            "seconds": seconds,
            "samples": samples,
            "tokens": tokens,
            "steps_per_sec": steps / seconds if steps and timed else None,
            "samples_per_sec": samples / seconds if samples is not None and timed else None,
            "tokens_per_sec": tokens / seconds if tokens is not None and timed else None,
            "flops_per_step": flops_per_step,
            "tflops": tflops,
            "peak_tflops": None if not peak_flops else peak_flops / 1e12,
            "mfu": mfu,
            "warmup_steps": warmup_steps,
        },
    )


@contextlib.contextmanager
def count_flops() -> Iterator[list[float]]:
    """Count the FLOPs run inside the block (``torch.utils.flop_counter.FlopCounterMode``:
    matmuls, convolutions, attention; forward and backward). The yielded list holds the
    total once the block ends.

    Example:
        >>> with instrument.throughput.count_flops() as flops:
        ...     loss = model(batch).sum(); loss.backward()
        >>> flops[0]
    """
    from instrument._torch_support import feature, missing

    counter = feature("torch.utils.flop_counter", "FlopCounterMode")
    if counter is None:
        raise RuntimeError(missing("count_flops (torch.utils.flop_counter.FlopCounterMode)", "2.1"))
    out: list[float] = []
    mode = counter(display=False)
    with mode:
        yield out
    out.append(float(mode.get_total_flops()))


#: ``count_batch(batch) -> (samples, tokens)``; either may be ``None`` (not known).
BatchCounter = Callable[[Any], tuple[int | None, int | None]]


def batch_counts(batch: Any) -> tuple[int | None, int | None]:
    """The samples of a batch (the first dimension of the first tensor found in it, looking
    into tuples, lists and mappings) and its tokens (``input_ids.numel()`` of a mapping with
    a 2-d ``input_ids``); ``None`` for what cannot be told. Reading shapes never waits for
    the device."""
    tokens = None
    if isinstance(batch, Mapping):
        ids = batch.get("input_ids")
        if isinstance(ids, torch.Tensor) and ids.dim() == 2:
            tokens = ids.numel()
    return _first_dim(batch, 4), tokens


def _first_dim(batch: Any, depth: int) -> int | None:
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else None
    if depth == 0:
        return None
    items: Iterable[Any]
    if isinstance(batch, Mapping):
        items = batch.values()
    elif isinstance(batch, (tuple, list)):
        items = batch
    else:
        return None
    for item in items:
        found = _first_dim(item, depth - 1)
        if found is not None:
            return found
    return None
