"""On a torch without a feature instrument uses: a clear error or a fallback said once.

Each test removes the feature from the installed torch (monkeypatch) and checks the message
names the feature, this torch and the release that has it.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils.flop_counter

import instrument
from instrument import observe
from instrument._torch_support import OLDEST_TORCH, feature, missing
from instrument.hooks import untraced
from instrument.throughput import count_flops


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def test_the_installed_torch_is_a_supported_one() -> None:
    assert _release(torch.__version__) >= _release(OLDEST_TORCH)


def test_the_message_names_the_feature_this_torch_and_the_release() -> None:
    message = missing("count_flops (X)", "2.1")
    expected = "instrument: count_flops (X) needs torch 2.1 or newer (this is torch {})"
    assert message == expected.format(torch.__version__)


def test_feature_is_none_for_a_missing_name_or_module() -> None:
    assert feature("torch.utils.flop_counter", "FlopCounterMode") is not None
    assert feature("torch.utils.flop_counter", "NoSuchThing") is None
    assert feature("torch.no_such_module", "FlopCounterMode") is None


def test_count_flops_without_flop_counter_raises_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(torch.utils.flop_counter, "FlopCounterMode")
    with (
        pytest.raises(RuntimeError, match=r"FlopCounterMode\) needs torch 2\.1 or newer"),
        count_flops(),
    ):
        pass


def test_count_flops_counts_where_torch_has_it() -> None:
    with count_flops() as flops:
        torch.ones(4, 8) @ torch.ones(8, 2)
    assert flops == [2 * 4 * 8 * 2]


def test_profiler_labels_fall_back_to_record_function(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch._C._profiler, "_RecordFunctionFast")
    with pytest.warns(RuntimeWarning, match=r"_RecordFunctionFast needs torch 2\.2 or newer"):
        ranged = observe._record_function("forward")
    assert isinstance(ranged, torch.autograd.profiler.record_function)
    with torch.profiler.profile() as prof, instrument.timed("forward"):
        pass
    assert "forward" in {event.name for event in prof.events()}


def test_without_compile_callbacks_hooks_start_as_python_twins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_callbacks() -> None:
        raise AttributeError("module 'torch._dynamo' has no attribute 'callback'")

    monkeypatch.setattr(untraced, "_traced", False)
    monkeypatch.setattr(untraced, "_callbacks", no_callbacks)
    with pytest.warns(RuntimeWarning, match=r"torch\._dynamo\.callback\) needs torch 2\.6"):
        assert untraced._register() is False
    assert not untraced.c_hooks_allowed()  # every hook is its traceable Python twin
