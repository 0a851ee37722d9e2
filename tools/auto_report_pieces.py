"""What each part of ``instrument.auto``'s report costs, in the auto-step benchmark's terms.

    python tools/auto_report_pieces.py [--rounds 150] [PART ...]

The auto-step benchmark's rows and turns (``run_paired(block=49, settle=1)``, thread CPU
time, one report in the middle of each of ``auto``'s turns), plus one row per PART: ``auto``
with that part of its flush made a no-op for that row's turns (every other row gets the
real flush back). Printed: each row's median step and its ratio to the hand-written hooks
(costs above the uninstrumented step, as the benchmark reports them). A part's cost is
``auto``'s ratio minus its row's; ``noflush`` (no report at all) gives the whole report's,
what the report evicts for the steps after it included. Parts:

- ``noflush``: ``Reporter.flush`` does nothing (``auto`` without reports);
- ``collect``: the flush only takes the registry's interval and the step counter's;
- ``nomemory``: no host memory sample;
- ``nothroughput``: no throughput;
- ``nocost``: no self-cost count nor ``SelfCost``;
- ``nobuild``: no ``Report`` built;
- ``nosignals``: neither the signal handlers' check nor the clock refresh;
- several joined by ``+`` (``nomemory+nobuild``): all of them in one row.

Each of these rows differs from ``auto`` by a few hundredths of the baseline, about this
machine's noise between runs: run it two or three times.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from time import thread_time_ns
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("parts", nargs="*", default=["noflush", "collect", "nomemory"])
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT / "tests" / "benchmarks"), str(ROOT / "tests"), str(ROOT)]
    import torch
    from paired import Contender, run_paired
    from test_auto_overhead import REPORT_EVERY, one_model_rows, reach_report_phase

    import instrument.reporter as reporter_module
    from instrument import registry
    from instrument.regions import frames

    torch.set_num_threads(1)
    step, plain, hand, auto, _, handle, lean, _ = one_model_rows()
    reporter = handle.reporter

    def noop(*args: Any, **kwargs: Any) -> None:
        return None

    def collect_only() -> None:
        registry.collect(registry.open_calls(frames.get_top()))
        reporter._counter.times.take()
        reporter._counter.end_interval()

    parts: dict[str, list[tuple[object, str, object]]] = {
        "noflush": [(reporter, "flush", noop)],
        "collect": [(reporter, "flush", collect_only)],
        "nomemory": [(reporter, "_memory", None)],
        "nothroughput": [(reporter, "_throughput", noop)],
        "nocost": [
            (reporter_module.selfcost, "count", lambda collected: (0, 0)),
            (reporter_module, "unchecked", noop),
        ],
        "nobuild": [(reporter_module, "build_report", noop)],
        "nosignals": [
            (reporter_module.lifecycle, "install_signal_handlers", noop),
            (reporter_module.config, "refresh_auto_clock", noop),
        ],
    }
    for combined in args.parts:  # "nomemory+nobuild": both parts in one row
        if "+" in combined and all(p in parts for p in combined.split("+")):
            parts[combined] = [patch for p in combined.split("+") for patch in parts[p]]
    unknown = sorted(set(args.parts) - set(parts))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; expected some of {', '.join(parts)}")
    originals = {
        (id(owner), name): (owner, name, name in vars(owner), getattr(owner, name))
        for patches in parts.values()
        for owner, name, _ in patches
    }

    def restore() -> None:
        for owner, name, own, value in originals.values():
            if own:
                setattr(owner, name, value)
            else:
                vars(owner).pop(name, None)

    def turn(part: str | None, instrumentation: Any) -> Any:
        def setup() -> None:
            restore()
            instrumentation.apply()
            for owner, name, value in parts[part] if part else []:
                setattr(owner, name, value)

        return setup

    auto.apply()
    reach_report_phase(step, reporter)
    rows = [
        Contender("hand", step, turn(None, hand), 1, baseline=True, above="plain"),
        Contender("auto", step, turn(None, auto), 1, above="plain"),
        *(Contender(p, step, turn(p, auto), 1, above="plain") for p in args.parts),
        Contender("lean", step, turn(None, lean), 1, above="plain"),
        Contender("plain", step, turn(None, plain), 1),
    ]
    try:
        summary, _ = run_paired(
            rows,
            rounds=args.rounds,
            warmup_rounds=2,
            clock=thread_time_ns,
            block=REPORT_EVERY - 1,
            settle=1,
        )
    finally:
        restore()
        auto.apply()
        handle.remove()
    width = max(len(row["label"]) for row in summary)
    print(f"{'row':{width}s} {'median step':>12s} {'ratio':>7s}")
    for row in summary:
        median_us, ratio = row["median_ns"] / 1e3, row["ratio_median"]
        print(f"{row['label']:{width}s} {median_us:9.2f} µs {ratio:7.3f}")


if __name__ == "__main__":
    main()
