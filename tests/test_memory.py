"""MemorySampler: host fields anywhere, interval peaks, device fields with and without CUDA."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch

from instrument import memory as memory_module
from instrument.memory import FIELDS, MemorySampler

MB = 10**6
MiB = 2**20

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_fields_are_the_documented_ones_in_order() -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "throughput.md").read_text()
    section = docs[docs.index("## `report.memory`") :]
    documented = re.findall(r"`((?:host|device)_\w+)`", section)
    assert tuple(dict.fromkeys(documented)) == FIELDS
    assert FIELDS[:2] == ("host_rss", "host_peak_rss")


def test_host_fields_are_plausible() -> None:
    memory = MemorySampler().sample()
    assert set(memory) <= set(FIELDS)
    assert all(type(value) is int for value in memory.values())
    assert memory["host_peak_rss"] > MB
    if "host_rss" in memory:  # always on Linux
        assert MB < memory["host_rss"] <= memory["host_peak_rss"]


def test_keys_follow_fields_order() -> None:
    memory = MemorySampler().sample()
    assert list(memory) == [field for field in FIELDS if field in memory]


def test_host_peak_is_per_interval() -> None:
    sampler = MemorySampler()
    if not sampler.host_peak_resets:
        pytest.skip("writing 5 to /proc/self/clear_refs is not supported here: lifetime peak")
    buffer = torch.ones(200 * MB // 4)  # written, so resident; freed back to the OS (munmap)
    del buffer
    first = sampler.sample()
    second = sampler.sample()
    assert first["host_peak_rss"] - second["host_peak_rss"] >= 150 * MB
    assert second["host_peak_rss"] >= second["host_rss"]


def test_without_proc_falls_back_to_lifetime_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_module, "_PROC_STATUS", "/nonexistent/status")
    monkeypatch.setattr(memory_module, "_PROC_STATM", "/nonexistent/statm")
    monkeypatch.setattr(memory_module, "_CLEAR_REFS", "/nonexistent/clear_refs")
    sampler = MemorySampler()
    memory = sampler.sample()
    assert not sampler.host_peak_resets
    assert "host_rss" not in memory  # unknown: left out, not guessed
    assert memory["host_peak_rss"] > MB  # getrusage ru_maxrss, KiB on Linux -> bytes


def test_no_device_fields_without_initialised_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_module, "cuda_ready", lambda: False)
    assert not any(key.startswith("device_") for key in MemorySampler().sample())


class FakeAllocator:
    """Stands in for torch.cuda's memory statistics on a CPU-only machine."""

    def __init__(self) -> None:
        self.stats = {
            "allocated_bytes.all.current": 100,
            "allocated_bytes.all.peak": 300,
            "reserved_bytes.all.current": 400,
            "reserved_bytes.all.peak": 500,
            "num_alloc_retries": 2,
            "num_ooms": 1,
        }
        self.resets: list[int] = []

    def memory_stats(self, device: int) -> dict[str, int]:
        return dict(self.stats)

    def reset_peak_memory_stats(self, device: int) -> None:
        self.resets.append(device)
        self.stats["allocated_bytes.all.peak"] = self.stats["allocated_bytes.all.current"]
        self.stats["reserved_bytes.all.peak"] = self.stats["reserved_bytes.all.current"]


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeAllocator:
    fake = FakeAllocator()
    monkeypatch.setattr(memory_module, "cuda_ready", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_stats", fake.memory_stats)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", fake.reset_peak_memory_stats)
    return fake


def test_device_fields_and_interval_counts(
    fake_cuda: FakeAllocator, caplog: pytest.LogCaptureFixture
) -> None:
    sampler = MemorySampler()  # baseline: 2 retries, 1 OOM before this interval
    assert fake_cuda.resets == [0]
    fake_cuda.stats["allocated_bytes.all.peak"] = 700
    fake_cuda.stats["num_alloc_retries"] = 5
    with caplog.at_level(logging.WARNING, logger="instrument"):
        memory = sampler.sample()
    assert {key: value for key, value in memory.items() if key.startswith("device_")} == {
        "device_allocated": 100,
        "device_peak_allocated": 700,
        "device_reserved": 400,
        "device_peak_reserved": 400,
        "device_alloc_retries": 3,
        "device_ooms": 0,
    }
    assert fake_cuda.resets == [0, 0]
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "3 CUDA allocation retries on cuda:0" in message
    assert "freed its cached blocks and retried" in message
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in message

    caplog.clear()
    memory = sampler.sample()
    assert memory["device_peak_allocated"] == 100  # reset after the previous sample
    assert memory["device_alloc_retries"] == 0
    assert not caplog.records


def test_two_samplers_each_see_the_device_peak_of_their_interval(fake_cuda: FakeAllocator) -> None:
    first, second = MemorySampler(), MemorySampler()
    fake_cuda.stats["allocated_bytes.all.peak"] = 900
    assert first.sample()["device_peak_allocated"] == 900  # and the peak is reset to 100
    fake_cuda.stats["allocated_bytes.all.peak"] = 300
    assert second.sample()["device_peak_allocated"] == 900  # the first one's reset kept it
    assert second.sample()["device_peak_allocated"] == 100
    assert first.sample()["device_peak_allocated"] == 300  # the second one's reading


def test_two_samplers_each_see_the_host_peak_of_their_interval() -> None:
    first, second = MemorySampler(), MemorySampler()
    if not first.host_peak_resets:
        pytest.skip("writing 5 to /proc/self/clear_refs is not supported here: lifetime peak")
    buffer = torch.ones(200 * MB // 4)  # written, so resident; freed back to the OS (munmap)
    del buffer
    peak = first.sample()["host_peak_rss"]
    assert second.sample()["host_peak_rss"] >= peak  # not lost to the first one's reset
    later = second.sample()
    assert peak - later["host_peak_rss"] >= 150 * MB


def test_reset_counters_are_not_negative(fake_cuda: FakeAllocator) -> None:
    sampler = MemorySampler()
    fake_cuda.stats["num_alloc_retries"] = 0  # torch.cuda.reset_accumulated_memory_stats()
    fake_cuda.stats["num_ooms"] = 0
    memory = sampler.sample()
    assert memory["device_alloc_retries"] == 0
    assert memory["device_ooms"] == 0


def test_device_errors_leave_device_fields_out(
    fake_cuda: FakeAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(device: int) -> dict[str, int]:
        raise RuntimeError("CUDA error: unknown error")

    monkeypatch.setattr(torch.cuda, "memory_stats", broken)
    memory = MemorySampler().sample()
    assert "host_peak_rss" in memory
    assert not any(key.startswith("device_") for key in memory)


@pytest.mark.cuda
@needs_cuda
def test_device_fields_on_a_gpu() -> None:
    torch.empty(1, device="cuda")  # initialise CUDA
    sampler = MemorySampler()
    buffer = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    del buffer
    first = sampler.sample()
    assert set(FIELDS) <= set(first)
    assert first["device_peak_allocated"] >= 256 * MiB
    assert first["device_peak_reserved"] >= first["device_reserved"] >= 256 * MiB  # cached
    assert first["device_peak_allocated"] >= first["device_allocated"]
    assert first["device_alloc_retries"] == 0
    assert first["device_ooms"] == 0
    second = sampler.sample()
    assert second["device_peak_allocated"] <= first["device_peak_allocated"] - 200 * MiB


@pytest.mark.cuda
@needs_cuda
def test_sampling_never_synchronizes() -> None:
    x = torch.ones(1024, 1024, device="cuda")
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sampler = MemorySampler()
        y = x @ x  # queued work, so a synchronizing call would have something to wait for
        memory = sampler.sample()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    del y
    assert "device_allocated" in memory


@pytest.mark.cuda
@needs_cuda
def test_allocation_retries_on_a_gpu(caplog: pytest.LogCaptureFixture) -> None:
    torch.empty(1, device="cuda")
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    limit = torch.cuda.memory_reserved() + 768 * MiB
    sampler = MemorySampler()
    torch.cuda.set_per_process_memory_fraction(limit / total)
    try:
        cached = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
        del cached  # 512 MiB stay reserved; 640 more would pass the limit
        bigger = torch.empty(640 * MiB, dtype=torch.uint8, device="cuda")  # frees cache, retries
        del bigger
        with caplog.at_level(logging.WARNING, logger="instrument"):
            memory = sampler.sample()
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    assert memory["device_alloc_retries"] == 1
    assert memory["device_ooms"] == 0
    assert "1 CUDA allocation retry on cuda:" in caplog.text
    assert sampler.sample()["device_alloc_retries"] == 0


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_forked_child_reads_its_own_proc_files() -> None:
    """The sampler keeps /proc/self/status and statm open; a forked child must not read its
    parent's."""
    import os

    def read_both() -> None:
        memory_module._proc_status()
        memory_module._rss_at_its_peak()

    read_both()  # opens the files in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            read_both()
            paths = (memory_module._PROC_STATUS, memory_module._PROC_STATM)
            fds = [memory_module._fds[(path, os.O_RDONLY)] for path in paths]
            os.write(write, " ".join(os.readlink(f"/proc/self/fd/{fd}") for fd in fds).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        targets = pipe.read().decode()
    os.waitpid(pid, 0)
    assert targets == f"/proc/{pid}/status /proc/{pid}/statm"


@pytest.mark.parametrize(
    "text",
    [
        b"Name:\tpython\nVmHWM:\t    2048 kB\nVmRSS:\t    1024 kB\nRssAnon:\t 1 kB\n",
        b"Name:\tpython\nVmRSS:\t    1024 kB\nOther:\t 1 kB\nVmHWM:\t    2048 kB\n",  # other order
    ],
)
def test_status_lines_are_read_in_either_layout(
    text: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    status = tmp_path / "status"
    status.write_bytes(text)
    monkeypatch.setattr(memory_module, "_PROC_STATUS", str(status))
    monkeypatch.setattr(memory_module, "_fds", {})
    assert memory_module._proc_status() == (1024 * 1024, 2048 * 1024)


def test_peak_is_reset_only_when_above_the_rss(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resetting VmHWM sets it to the RSS: when the two are equal the write is skipped."""
    sampler = MemorySampler()
    resets: list[int] = []
    monkeypatch.setattr(sampler, "_reset_host_peak", lambda: resets.append(1))
    monkeypatch.setattr(memory_module, "_rss_at_its_peak", lambda: None)
    monkeypatch.setattr(memory_module, "_proc_status", lambda: (100 * MiB, 100 * MiB))
    assert sampler.sample()["host_peak_rss"] == 100 * MiB
    assert resets == []
    monkeypatch.setattr(memory_module, "_proc_status", lambda: (100 * MiB, 300 * MiB))
    assert sampler.sample()["host_peak_rss"] == 300 * MiB
    assert resets == [1] or not sampler.host_peak_resets


_AT_PEAK = """
import os, resource, sys
import torch
from instrument import memory
page = os.sysconf("SC_PAGE_SIZE")
rss = int(open("/proc/self/statm").read().split()[1]) * page
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
buffer = torch.ones((max(peak - rss, 0) + 64 * 2**20) // 4)  # written: the RSS at a new high
reads = []
status = memory._proc_status
memory._proc_status = lambda: reads.append(1) or status()
sample = memory.MemorySampler().sample()
vm_rss, vm_hwm = status()
print(len(reads), sample["host_rss"], sample["host_peak_rss"], vm_rss, vm_hwm)
"""


@pytest.mark.slow  # a subprocess
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")
def test_rss_at_its_peak_needs_no_status_read() -> None:
    """In a process whose RSS is at its highest, the sample skips /proc/self/status (ten
    times dearer) and reports what it would have: VmHWM equal to VmRSS."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _AT_PEAK], capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    reads, rss, peak, vm_rss, vm_hwm = map(int, out)
    assert reads == 0
    assert peak == rss
    assert vm_hwm == vm_rss  # what the status read says just after
    assert abs(rss - vm_rss) <= MiB


_OTHER_THREAD = """
import os, resource, threading
import torch
from instrument import memory
page = os.sysconf("SC_PAGE_SIZE")
sampler = memory.MemorySampler()  # resets the peak to the RSS
rss = int(open("/proc/self/statm").read().split()[1]) * page
def high():  # a new high in another thread, given back to the system (munmap) at once
    buffer = torch.ones(128 * 2**20 // 4)
    del buffer
thread = threading.Thread(target=high)
thread.start()
thread.join()
print(memory._RUSAGE_PEAK == getattr(resource, "RUSAGE_THREAD", -1))
print(memory._rss_at_its_peak() is None, sampler.sample()["host_peak_rss"] - rss)
"""


@pytest.mark.slow  # a subprocess
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")
def test_a_peak_reached_in_another_thread_counts() -> None:
    """The cheap peak read asks ``getrusage`` for the calling thread (not summing every
    thread's CPU times): its ``ru_maxrss`` is still the process's, so a high reached and
    left by another thread makes the cheap read decline and the status read report it."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _OTHER_THREAD],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    assert out[0] == "True"  # Linux: RUSAGE_THREAD
    assert out[1] == "True"
    assert int(out[2]) >= 100 * MiB


def test_a_freed_peak_is_read_from_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory given back to the system since the peak: the cheap reads cannot prove the
    peak, so /proc/self/status is read."""
    sampler = MemorySampler()
    buffer = torch.ones(200 * MB // 4)
    del buffer  # freed back to the OS (munmap): ru_maxrss stays above the RSS
    reads: list[int] = []
    status = memory_module._proc_status
    monkeypatch.setattr(memory_module, "_proc_status", lambda: reads.append(1) or status())
    assert memory_module._rss_at_its_peak() is None
    memory = sampler.sample()
    assert reads == [1]
    assert memory["host_peak_rss"] - memory["host_rss"] >= 150 * MB
