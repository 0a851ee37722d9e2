"""One rank lookup (instrument.rank) for the reporter, the file sinks, the distributed helpers
and the compat timers: each caller keeps its answer without a process group, all follow a
stub ``torch.distributed`` (NeMo's unit tests) and a real gloo group alike."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch.distributed as dist
from compat_helpers import stub_torch_distributed
from distributed_helpers import run_ranks

import instrument
from instrument import rank as rank_lookup
from instrument.compat import bing_bert, deepspeed
from instrument.distributed import helpers
from instrument.testing import FakeClock, capture_reports, use_clock


def _who_prints(capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    """What each caller's rank-dependent printing prints here."""
    out = {}
    helpers.print_rank_0("helpers")
    out["helpers"] = capsys.readouterr().out
    bing_bert.print_rank_0("bing_bert")
    out["bing_bert"] = capsys.readouterr().out
    deepspeed.SynchronizedWallClockTimer().log([])
    out["deepspeed"] = capsys.readouterr().out
    return out


def test_without_a_process_group_each_caller_keeps_its_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert rank_lookup.rank() == 0
    assert rank_lookup.rank(default=-1) == -1
    assert rank_lookup.rank_and_world() == (0, 1)
    assert _who_prints(capsys) == {
        "helpers": "helpers\n",
        "bing_bert": "bing_bert\n",
        "deepspeed": "[Rank -1] time (ms)\n",  # DeepSpeed's -1 without a group
    }
    with use_clock(FakeClock()), capture_reports() as reports, instrument.timed("x"):
        pass
    assert (reports[-1].rank, reports[-1].world_size) == (0, 1)


def test_a_stub_torch_distributed_answers_every_caller(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stub_torch_distributed(monkeypatch, rank=1, world_size=2)
    assert rank_lookup.rank() == 1
    assert rank_lookup.rank(default=-1) == 1
    assert rank_lookup.rank_and_world() == (1, 2)
    assert _who_prints(capsys) == {"helpers": "", "bing_bert": "", "deepspeed": ""}
    with use_clock(FakeClock()), capture_reports() as reports, instrument.timed("x"):
        pass
    assert (reports[-1].rank, reports[-1].world_size) == (1, 2)


def _ranks_seen(rank: int, world_size: int) -> dict[str, Any]:
    low = dist.new_group([1])
    return {
        "rank": rank_lookup.rank(),
        "absent": rank_lookup.rank(default=-1),
        "in_group": rank_lookup.rank(low) if rank == 1 else None,
        "rank_and_world": rank_lookup.rank_and_world(),
    }


@pytest.mark.slow  # two ranks
@pytest.mark.timeout(120)
def test_a_gloo_group_answers_every_caller() -> None:
    seen = run_ranks(_ranks_seen, 2)
    assert seen == [
        {"rank": 0, "absent": 0, "in_group": None, "rank_and_world": (0, 2)},
        {"rank": 1, "absent": 1, "in_group": 0, "rank_and_world": (1, 2)},
    ]


def _rank_across_regrouping(rank: int, world_size: int, store: str) -> list[tuple[int, int]]:
    """``rank_and_world()`` in a group, after it is destroyed, and in a new group where the
    ranks are swapped (each answer kept by the cache must follow the default group)."""
    seen = [rank_lookup.rank_and_world(), rank_lookup.rank_and_world()]
    dist.destroy_process_group()
    seen.append(rank_lookup.rank_and_world())
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=world_size - 1 - rank, world_size=world_size
    )
    seen.append(rank_lookup.rank_and_world())
    return seen


@pytest.mark.slow  # two ranks
@pytest.mark.timeout(120)
def test_the_kept_rank_follows_the_default_group(tmp_path: Any) -> None:
    seen = run_ranks(_rank_across_regrouping, 2, str(tmp_path / "store"))
    assert seen == [[(0, 2), (0, 2), (0, 1), (1, 2)], [(1, 2), (1, 2), (0, 1), (0, 2)]]


def test_the_kept_rank_follows_patched_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    assert rank_lookup.rank_and_world() == (0, 1)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 3)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    assert rank_lookup.rank_and_world() == (3, 4)
    monkeypatch.undo()
    assert rank_lookup.rank_and_world() == (0, 1)


def test_the_world_watch_holds_no_group_and_tells_a_dead_one_from_none() -> None:
    """It keeps a weak reference only (a group it held would outlive
    ``destroy_process_group()``), and a group that died is not "no group"."""

    class Group:
        pass

    watch = rank_lookup.WorldWatch()
    assert watch.changed(None)
    assert not watch.changed(None)
    group = Group()
    assert watch.changed(group)
    assert not watch.changed(group)
    gone = weakref.ref(group)
    del group
    gc.collect()
    assert gone() is None  # not kept alive by the watch
    assert watch.changed(None)  # destroyed: no group now, another answer
    assert not watch.changed(None)
