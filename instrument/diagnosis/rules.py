"""The rules that read one report (a :class:`~instrument.diagnosis.view.View`) into findings.

Each rule takes the view and the :class:`Thresholds` in force and returns a finding or
``None``. The rules over the run's history (slowdown, memory creep) are in
:mod:`instrument.diagnosis.trends`.
"""

from __future__ import annotations

from collections.abc import Callable

from instrument.diagnosis.thresholds import Thresholds
from instrument.diagnosis.view import View
from instrument.distributed.stragglers import is_collective
from instrument.findings import Finding
from instrument.report import Node

Rule = Callable[[View, Thresholds], Finding | None]

#: Phases whose domination is a problem of its own (not the model's compute).
UPDATE_PHASES = ("optimizer", "zero_grad")


def ms(seconds: float) -> str:
    """``0.0123`` → ``"12.3 ms"``, ``4.5`` → ``"4.5 s"`` (three significant figures)."""
    if seconds >= 1.0:
        return f"{seconds:.3g} s"
    return f"{seconds * 1e3:.3g} ms"


def pct(share: float) -> str:
    """``0.583`` → ``"58 %"``."""
    return f"{100 * share:.0f} %"


def size(nbytes: float) -> str:
    """Bytes in decimal units: ``"84.2 MB"``."""
    value = float(nbytes)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(value) < 1000.0 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1000.0
    raise AssertionError("unreachable")  # pragma: no cover


def _severity(value: float, warning: float, critical: float) -> str | None:
    if value >= critical:
        return "critical"
    if value >= warning:
        return "warning"
    return None


def _over(how: str) -> str:
    return f" ({how})" if how else ""


def input_bound(v: View, t: Thresholds) -> Finding | None:
    """The step waits for data: the ``data`` phase's share, lowest (or median) over ranks."""
    data = v.phase("data")
    if data is None or not v.has_steps:
        return None
    seconds, how = v.typical(data)
    share = v.share_of(data, seconds)
    severity = _severity(share, t.input_share, t.input_critical)
    if severity is None:
        return None
    return Finding(
        "input_bound",
        severity,
        f"{data.path} took {pct(v.share(seconds))} of the step{_over(how)}: "
        f"{ms(seconds)} of {ms(v.step)}",
        "raise the DataLoader's num_workers, set pin_memory=True and persistent_workers=True, "
        "and move per-sample work (decoding, augmentation) out of __getitem__ or prefetch it",
        path=data.path,
        evidence={
            "share": v.share(seconds),
            "judged_share": share,
            "data_s": seconds,
            "step_s": v.step,
        },
    )


def _dominant(v: View, phase: Node) -> Node:
    """The deepest region along the largest children of ``phase`` that still holds at least
    half of its parent's time."""
    node = phase
    while True:
        kids = [k for k in v.children(node.path) if not k.concurrent]
        if not kids:
            return node
        big = max(kids, key=lambda k: k.total)
        if big.total < 0.5 * node.total:
            return node
        node = big


def compute_bound(v: View, t: Thresholds) -> Finding | None:
    """One phase (not ``data``) holds most of the step: info for the model's compute, a
    warning when it is the optimizer's update."""
    if not v.has_steps:
        return None
    data = v.phase("data")
    phase = max((n for n in v.phases if n is not data), key=lambda n: n.total, default=None)
    if phase is None:
        return None
    share = v.share_of(phase, v.seconds(phase))
    update = phase.name in UPDATE_PHASES
    if update and share >= t.optimizer_share:
        severity = "warning"
    elif share >= t.compute_share:
        severity = "info"
    else:
        return None
    top = _dominant(v, phase)
    inside = ""
    if top is not phase:
        inside = f", most of it in {top.path} ({pct(v.share(v.seconds(top)))} of the step)"
    if update:
        hint = (
            "use a fused or foreach optimizer (torch.optim.AdamW(fused=True)), fewer parameter "
            "groups, or shard the optimizer state (ZeRO, FSDP)"
        )
    else:
        hint = (
            f"this is where the step's compute is; to speed up {top.path}, try mixed precision "
            "(bf16 autocast), torch.compile, or a larger batch per step"
        )
    return Finding(
        "compute_bound",
        severity,
        f"{phase.path} took {pct(v.share(v.seconds(phase)))} of the step "
        f"({ms(v.seconds(phase))} of {ms(v.step)}){inside}",
        hint,
        path=top.path,
        evidence={
            "phase": phase.path,
            "share": v.share(v.seconds(phase)),
            "judged_share": share,
            "phase_s": v.seconds(phase),
            "step_s": v.step,
            "dominant": top.path,
            "dominant_share": v.share(v.seconds(top)),
        },
    )


def residual_heavy(v: View, t: Thresholds) -> Finding | None:
    """Much of the step is in no region."""
    if not v.has_steps:
        return None
    share = v.other_share()
    severity = _severity(share, t.residual_share, t.residual_critical)
    if severity is None:
        return None
    where = "in no region"
    if v.phase("data") is None:
        where += " (it includes loading the data: no data line)"
    elif {"forward", "optimizer"} <= {n.name for n in v.phases}:
        where += ", between the optimizer step and the next batch or around the phases"
    return Finding(
        "residual_heavy",
        severity,
        f"{pct(share)} of the step ({ms(v.other)} of {ms(v.step)}) was {where}",
        "name it: wrap the code between steps (logging, metrics, .item() or .cpu() calls, "
        "evaluation, checkpoint saves) in instrument.timed('...') to see which it is",
        path=v.other_path,
        evidence={"share": share, "other_s": v.other, "step_s": v.step},
    )


def collective_wait(v: View, t: Thresholds) -> Finding | None:
    """Much of the step has a collective in flight (waiting for other ranks or the network)."""
    if not v.has_steps:
        return None
    seconds = v.in_collectives()
    share = v.share(seconds)
    if share < t.collective_share:
        return None
    biggest = max(v.collectives(), key=lambda n: n.total)
    why = (
        f"collectives were in flight for {pct(share)} of the step ({ms(seconds)} of "
        f"{ms(v.step)}, async ones counted once), the largest {biggest.path}"
    )
    severity = "warning"
    hint = (
        "check that ranks arrive together (a straggler makes the others wait here), overlap "
        "communication with compute (DDP bucket_cap_mb, FSDP prefetch), or reduce its volume"
    )
    r = biggest.ranks
    if r is not None and r.ranks_present >= 2 and r.rank_min < t.collective_even * r.rank_max:
        severity = "info"  # most of it is waiting for the rank that arrives last
        why += (
            f"; rank {r.rank_argmin} spends {ms(r.rank_min * v.scale)} there against "
            f"{ms(r.rank_max * v.scale)} on rank {r.rank_argmax}: the others wait for it"
        )
        hint = f"look at what rank {r.rank_argmin} does before {biggest.path}"
    return Finding(
        "collective_wait",
        severity,
        why,
        hint,
        path=biggest.path,
        evidence={"share": share, "collective_s": seconds, "step_s": v.step},
    )


def straggler(v: View, t: Thresholds) -> Finding | None:
    """One rank is slower in a phase (by its own time, the waiting for others taken out),
    beyond the ranks' step-to-step spread, and the others wait for it in a collective.
    A collective is never scored (its time is waiting: the rank with the most there is a
    victim), nor the warm-up interval. The figures compared are the same on every rank,
    so the finding reads the same in every rank's report."""
    if not v.has_steps or v.warm_up:
        return None
    step = v.slowest_step
    worst = None
    for phase in v.phases:
        if phase.ranks is None or phase.ranks.ranks_present < 2 or is_collective(phase):
            continue
        own = v.own(phase)
        if own is None:
            continue
        excess = own.high - own.low
        if excess < t.straggler_excess * step or own.high < t.straggler_ratio * own.low:
            continue
        if excess < t.straggler_noise * v.noise(phase):
            continue
        if worst is None or excess > worst[1]:
            worst = (phase, excess, own)
    if worst is None:
        return None
    phase, excess, own = worst
    culprit = own.high_rank
    severity = "critical" if excess >= 3 * t.straggler_excess * step else "warning"
    waits = [n for n in v.collectives() if n.ranks is not None and n.ranks.rank_argmax != culprit]
    wait = max(
        waits, key=lambda n: n.ranks.rank_max - n.ranks.rank_min if n.ranks else 0.0, default=None
    )
    victim = ""
    evidence: dict[str, object] = {
        "phase": phase.path,
        "excess_s": excess,
        "slow_s": own.high,
        "fast_s": own.low,
        "fast_rank": own.low_rank,
        "step_s": step,
    }
    if wait is not None and wait.ranks is not None:
        low, high = wait.ranks.rank_min * v.scale, wait.ranks.rank_max * v.scale
        waited = high - low
        victim = (
            f"; rank {wait.ranks.rank_argmax} waits for it in {wait.path} "
            f"({ms(high)} there against {ms(low)})"
        )
        evidence.update(waiting_rank=wait.ranks.rank_argmax, waiting_in=wait.path, waited_s=waited)
    what = "its data loading (disk, network, num_workers, the samples its sampler gives it)"
    if phase.name != "data":
        what = (
            f"what differs on it in {phase.path}: its device or host (throttling, other "
            "processes), its inputs (uneven lengths), work only it does"
        )
    return Finding(
        "straggler",
        severity,
        f"rank {culprit} is slow in {phase.path}: {ms(own.high)} per step against "
        f"{ms(own.low)} on rank {own.low_rank} (+{ms(excess)}){victim}",
        f"look at rank {culprit}: {what}",
        path=phase.path,
        rank=culprit,
        evidence=evidence,
    )


def memory_pressure(v: View, t: Thresholds) -> Finding | None:
    """Memory near capacity, allocator retries or out-of-memory errors."""
    memory = v.report.memory
    ooms = memory.get("device_ooms", 0)
    retries = memory.get("device_alloc_retries", 0)
    total = memory.get("device_total")
    peak = memory.get("device_peak_reserved", memory.get("device_reserved"))
    host_total = memory.get("host_total")
    rss = memory.get("host_peak_rss", memory.get("host_rss"))
    evidence: dict[str, object] = {"device_ooms": ooms, "device_alloc_retries": retries}
    if ooms:
        severity, why = "critical", f"{ooms} CUDA out-of-memory errors in the interval"
    elif total and peak is not None and peak >= t.pressure_share * total:
        severity = "warning"
        why = f"the CUDA allocator reserved up to {size(peak)} of the device's {size(total)}"
        evidence.update(device_peak_reserved=peak, device_total=total)
    elif retries:
        severity = "warning"
        why = f"{retries} CUDA allocations had to free the cache and retry (fragmentation)"
    elif host_total and rss is not None and rss >= t.pressure_share * host_total:
        severity = "warning"
        why = f"this process holds up to {size(rss)} of the host's {size(host_total)}"
        evidence.update(host_peak_rss=rss, host_total=host_total)
    else:
        return None
    return Finding(
        "memory_pressure",
        severity,
        why,
        "lower the batch size or sequence length, use activation checkpointing or mixed "
        "precision, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against "
        "fragmentation",
        rank=v.report.rank if v.report.world_size > 1 else None,
        evidence=evidence,
    )


def missing(v: View, t: Thresholds) -> Finding | None:
    """A signal a rule needs was not measured: say so rather than judge without it."""
    gaps = []
    if v.has_steps and v.phase("data") is None:
        gaps.append("data loading (no data line, so input-bound cannot be judged)")
    if not v.report.memory and v.has_steps:
        gaps.append("memory (not sampled, so creep and pressure cannot be judged)")
    if not gaps:
        return None
    hints = []
    if v.phase("data") is None:
        hints.append(
            "pass dataloader=loader to instrument.auto(), or wrap next(it) in "
            "instrument.timed('data')"
        )
    if not v.report.memory:
        hints.append("leave Reporter(memory=True)")
    return Finding(
        "incomplete",
        "info",
        "not measured: " + "; ".join(gaps),
        "; ".join(hints),
        evidence={"missing": ["data" if g.startswith("data") else "memory" for g in gaps]},
    )


#: The per-report rules, each with the kind whose hysteresis it follows.
RULES: tuple[tuple[str, Rule], ...] = (
    ("straggler", straggler),
    ("input_bound", input_bound),
    ("residual_heavy", residual_heavy),
    ("collective_wait", collective_wait),
    ("compute_bound", compute_bound),
    ("memory_pressure", memory_pressure),
    ("incomplete", missing),
)
