"""Memory per reporting interval, sampled at flush time (never on a hot path).

:meth:`MemorySampler.sample` returns bytes (ints) under these keys, in :data:`FIELDS` order;
a key whose value cannot be read on this platform is left out, nothing raises:

- ``host_rss``: the process's resident set size now (Linux: ``VmRSS`` of ``/proc/self/status``,
  the same counter as the resident pages of ``/proc/self/statm``; left out elsewhere).
- ``host_total``: the host's physical memory (``sysconf``; left out where unknown).
- ``host_peak_rss``: the peak resident set size since the previous sample (Linux: ``VmHWM``,
  reset after reading; ``/proc/self/status`` is read only where ``getrusage`` and
  ``/proc/self/statm`` cannot show that the peak is the RSS now: :func:`_rss_at_its_peak`).
  Where the peak cannot be reset, or without ``/proc`` (macOS), it is the lifetime peak
  (``getrusage().ru_maxrss``) - see :class:`MemorySampler`.
- ``device_allocated`` / ``device_peak_allocated``: bytes held by tensors in PyTorch's CUDA
  caching allocator on the current device, now and the interval's peak.
- ``device_reserved`` / ``device_peak_reserved``: bytes the caching allocator holds from the
  driver (tensors plus its cache), now and the interval's peak.
- ``device_total``: the current device's memory (its properties' ``total_memory``).
- ``device_alloc_retries``: allocations in the interval that failed, made the allocator free
  its cached blocks and try again - a sign of fragmentation or memory pressure, and slow.
- ``device_ooms``: out-of-memory errors the allocator raised in the interval.

The ``device_*`` keys appear only while CUDA is available and already initialised in this
process (sampling never initialises it), and not in a child forked from a CUDA parent. They
come from ``torch.cuda.memory_stats()`` and ``torch.cuda.reset_peak_memory_stats()``, which
read and reset host-side counters: nothing here synchronizes the device.
"""

from __future__ import annotations

import logging
import os
import sys
import weakref

import torch

try:  # imported here, never inside a flush (a fork during a flush must not hold its lock)
    import resource
except ImportError:  # Windows
    resource = None  # type: ignore[assignment]

from instrument.clocks import cuda_ready

logger = logging.getLogger("instrument")

FIELDS: tuple[str, ...] = (
    "host_rss",
    "host_peak_rss",
    "host_total",
    "device_allocated",
    "device_peak_allocated",
    "device_reserved",
    "device_peak_reserved",
    "device_total",
    "device_alloc_retries",
    "device_ooms",
)
"""Every key :meth:`MemorySampler.sample` can return, host first, then device."""

_PROC_STATUS = "/proc/self/status"
_PROC_STATM = "/proc/self/statm"
_CLEAR_REFS = "/proc/self/clear_refs"

_DEVICE_STATS = (
    ("device_allocated", "allocated_bytes.all.current"),
    ("device_peak_allocated", "allocated_bytes.all.peak"),
    ("device_reserved", "reserved_bytes.all.current"),
    ("device_peak_reserved", "reserved_bytes.all.peak"),
)
_DEVICE_COUNTS = (
    ("device_alloc_retries", "num_alloc_retries"),
    ("device_ooms", "num_ooms"),
)


#: ``/proc`` files kept open in this process, by (path, flags): a flush reads and writes
#: them with one system call each instead of an open, a read and a close.
_fds: dict[tuple[str, int], int] = {}


def _fd(path: str, flags: int) -> int:
    """This process's descriptor of ``path`` (opened on first use); ``OSError`` if it
    cannot be opened."""
    key = (path, flags)
    fd = _fds.get(key)
    if fd is None:
        fd = _fds[key] = os.open(path, flags)
    return fd


def _reopen_after_fork() -> None:
    """In a forked child the inherited descriptors still name the parent's ``/proc`` files:
    close them, so that the child opens its own."""
    fds = list(_fds.values())
    _fds.clear()
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reopen_after_fork)


def _kib_field(text: bytes, key: bytes) -> int | None:
    """The value of ``key`` (e.g. ``b"VmRSS:"``, a line ``VmRSS:   26000 kB``) in bytes."""
    start = text.find(key)
    if start < 0:
        return None
    end = text.find(b"\n", start)
    parts = text[start + len(key) : end if end >= 0 else len(text)].split()
    return int(parts[0]) * 1024 if parts and parts[0].isdigit() else None


def _proc_status() -> tuple[int | None, int | None]:
    """``(VmRSS, VmHWM)`` in bytes from one read of ``/proc/self/status`` (None: unknown)."""
    try:  # VmHWM and VmRSS come in the first KiB
        text = os.pread(_fd(_PROC_STATUS, os.O_RDONLY), 4096, 0)
    except OSError:
        return None, None
    start = text.find(b"VmHWM:")  # Linux writes "VmHWM: <kB> kB\nVmRSS: <kB> kB"
    parts = text[start : start + 64].split() if start >= 0 else []
    if len(parts) > 4 and parts[3] == b"VmRSS:" and parts[1].isdigit() and parts[4].isdigit():
        return int(parts[4]) * 1024, int(parts[1]) * 1024
    return _kib_field(text, b"VmRSS:"), _kib_field(text, b"VmHWM:")


try:
    _PAGE = os.sysconf("SC_PAGE_SIZE")
    _HOST_TOTAL: int | None = _PAGE * os.sysconf("SC_PHYS_PAGES") or None
except (AttributeError, ValueError, OSError):  # no sysconf (Windows)
    _PAGE = 0
    _HOST_TOTAL = None

#: ``getrusage`` of the calling thread where the platform has it (Linux): its ``ru_maxrss``
#: is the process's, as for ``RUSAGE_SELF`` (the kernel reads both from the memory map and
#: the signal struct), without summing every thread's CPU times under a lock — a training
#: process runs dozens of threads (64 idle threads: 1.2 µs against 0.35 µs per call).
_RUSAGE_PEAK: int = getattr(resource, "RUSAGE_THREAD", getattr(resource, "RUSAGE_SELF", 0))


def _rss_at_its_peak() -> int | None:
    """The RSS in bytes when two cheap reads prove it is the peak since the last reset, else
    None (then ``/proc/self/status`` is read: ten times dearer in the kernel).

    ``getrusage``'s ``ru_maxrss`` is at least the kernel's peak mark (it is the larger of
    that mark, the RSS and the peaks folded in when threads exited), and VmHWM is the larger
    of the mark and the RSS: so a ``ru_maxrss`` no higher than the RSS of
    ``/proc/self/statm`` (the counters of VmRSS) means VmHWM is that RSS. Not so once memory
    went back to the system since the peak, or a thread exited at a higher one."""
    if resource is None or not _PAGE or sys.platform == "darwin":
        return None
    try:
        resident = os.pread(_fd(_PROC_STATM, os.O_RDONLY), 128, 0).split()[1]
        peak_kib = resource.getrusage(_RUSAGE_PEAK).ru_maxrss
    except (OSError, IndexError):
        return None
    if not resident.isdigit():
        return None
    rss = int(resident) * _PAGE
    return rss if peak_kib * 1024 <= rss else None


def _lifetime_peak_rss() -> int | None:
    """The process's lifetime peak RSS in bytes from ``getrusage``, or ``None`` (Windows)."""
    if resource is None:
        return None
    try:
        peak = resource.getrusage(_RUSAGE_PEAK).ru_maxrss
    except OSError:
        return None
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024  # macOS: bytes, else KiB


class MemorySampler:
    """Host and device memory per interval: each :meth:`sample` covers the time since the
    previous one (the first, the time since construction).

    The host peak is reset by writing ``5`` to ``/proc/self/clear_refs`` (Linux 4.0+; skipped
    when the peak read equals the RSS, which is what a reset would make it). Where
    that write fails (an old kernel, a sandbox without it, no ``/proc``),
    :attr:`host_peak_resets` is ``False`` and ``host_peak_rss`` is the process's lifetime peak.

    Peaks are process-wide: the host peak for the whole process, the device peaks for each
    device. Live samplers (one per reporter) share them: a sample hands the peaks it read
    before resetting them to every other live sampler, whose next sample reports the larger
    of those and its own reading. Other code calling ``torch.cuda.reset_peak_memory_stats()``
    still shortens the intervals. Device fields describe the current device; call
    :meth:`sample` from one thread at a time.

    Example:
        >>> sampler = MemorySampler()
        >>> memory = sampler.sample()  # at each flush
        >>> "host_peak_rss" in memory  # everywhere; host_rss where the platform tells
        True
    """

    def __init__(self) -> None:
        self._host_peak_resets = True
        self._counts: dict[int, dict[str, int]] = {}  # device -> counters at the last sample
        self._totals: dict[int, int] = {}  # device -> its memory
        self._carried: dict[str, int] = {}  # peaks other samplers reset since this one's
        if _samplers:  # the live samplers keep the peaks of their intervals so far
            _share(self, self._read(warn=False))
        else:
            self._reset_host_peak()
            self._sample_device(warn=False)  # reset the device peaks, the counters' baseline
        _samplers.add(self)

    @property
    def host_peak_resets(self) -> bool:
        """Whether ``host_peak_rss`` is the interval's peak (``False``: the lifetime peak)."""
        return self._host_peak_resets

    def sample(self) -> dict[str, int]:
        """Memory now and since the previous sample, in bytes; then reset the peaks."""
        memory = self._read()
        if len(_samplers) > 1:
            _share(self, memory)
        carried, self._carried = self._carried, {}
        for field, peak in carried.items():
            if field in memory and peak > memory[field]:
                memory[field] = peak
        return memory

    def _read(self, *, warn: bool = True) -> dict[str, int]:
        """Memory now and the peaks since the last reset, in bytes; then reset the peaks."""
        # (the host's sample inline: a flush runs it every interval)
        memory: dict[str, int] = {}
        rss = peak = _rss_at_its_peak()
        if rss is None:
            rss, peak = _proc_status()
        if rss is not None:
            memory["host_rss"] = rss
        if peak is None:
            peak = _lifetime_peak_rss()
        if peak is not None:
            memory["host_peak_rss"] = peak
        if _HOST_TOTAL is not None:
            memory["host_total"] = _HOST_TOTAL
        # A peak equal to the RSS just read is already what a reset would make it (the
        # kernel's peak is the larger of its last mark and the RSS): no write needed.
        if self._host_peak_resets and (rss is None or peak is None or peak > rss):
            self._reset_host_peak()
        if cuda_ready():
            memory.update(self._sample_device(warn=warn))
        return memory

    def _reset_host_peak(self) -> None:
        if not self._host_peak_resets:
            return
        try:  # 5: reset the peak RSS (VmHWM) to the current RSS
            os.write(_fd(_CLEAR_REFS, os.O_WRONLY), b"5")
        except OSError:
            self._host_peak_resets = False

    def _sample_device(self, *, warn: bool = True) -> dict[str, int]:
        if not cuda_ready():
            return {}
        try:
            device = torch.cuda.current_device()
            stats = torch.cuda.memory_stats(device)
            torch.cuda.reset_peak_memory_stats(device)
        except RuntimeError:  # e.g. a broken driver: leave the device fields out
            return {}
        memory = {field: int(stats[key]) for field, key in _DEVICE_STATS if key in stats}
        total = self._totals.get(device)
        if total is None:
            try:
                total = torch.cuda.get_device_properties(device).total_memory
            except Exception:  # a driver that cannot tell: no capacity, nothing judged on it
                total = 0
            self._totals[device] = total = int(total)
        if total:
            memory["device_total"] = total
        before = self._counts.get(device, {})
        now = {field: int(stats[key]) for field, key in _DEVICE_COUNTS if key in stats}
        for field, count in now.items():
            previous = before.get(field, 0)
            memory[field] = count - previous if count >= previous else count  # counters reset
        self._counts[device] = now
        retries = memory.get("device_alloc_retries", 0)
        if warn and retries > 0:
            logger.warning(
                "instrument: %d CUDA allocation retr%s on cuda:%d since the last sample: the "
                "caching allocator could not allocate, freed its cached blocks and retried "
                "(fragmentation or memory pressure, and slow); reduce the batch size or set "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                retries,
                "y" if retries == 1 else "ies",
                device,
            )
        return memory


#: The fields that are peaks since the last reset (shared between live samplers).
PEAKS = ("host_peak_rss", "device_peak_allocated", "device_peak_reserved")

#: The live samplers (weakly held: a dropped reporter's sampler goes with it).
_samplers: weakref.WeakSet[MemorySampler] = weakref.WeakSet()


def _share(reader: MemorySampler, memory: dict[str, int]) -> None:
    """Hand the peaks ``reader`` just read (and reset) to every other live sampler."""
    for other in list(_samplers):
        if other is reader:
            continue
        for field in PEAKS:
            value = memory.get(field)
            if value is not None and value > other._carried.get(field, -1):
                other._carried[field] = value
