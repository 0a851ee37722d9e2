"""Hot-path and flush costs of two checkouts, measured in turn (A B A B ...) on this machine.

    python tools/before_after.py /path/to/before /path/to/after [--rounds 5]

Each round runs one fresh interpreter per checkout (``PYTHONPATH=<checkout>``, its C
accelerator built in place) that times, in thread CPU time, the best of a few batches of:
``with timed()``, a ``@timed`` call, two nested regions (costs above an empty loop or a plain
call), a flush of 100 paths x 10 calls, and one ``instrument.auto`` step of a tiny MLP with
AdamW (above the same step without ``auto``). Rows are the median over rounds of each
round's best; the ratio is after / before. Alternating the two checkouts round by round
keeps a drift of the machine out of the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PROBE = r"""
import json, time
import torch
from torch import nn
import instrument
from instrument import _native

torch.set_num_threads(1)
clock = time.thread_time_ns

def best(body, batch, repeat=15):
    out = float("inf")
    for _ in range(repeat):
        t = clock(); body(batch); out = min(out, (clock() - t) / batch)
    return out

region = instrument.timed("x")
def empty(n):
    for _ in range(n): pass
def with_region(n):
    for _ in range(n):
        with region: pass
def nested(n):
    inner = instrument.timed("y")
    for _ in range(n):
        with region:
            with inner: pass
def plain():
    pass
decorated = instrument.timed("f")(plain)
def calls_plain(n):
    for _ in range(n): plain()
def calls_decorated(n):
    for _ in range(n): decorated()

reporter = instrument.Reporter(every=None, sinks=[])
names = [instrument.timed(f"p{i}") for i in range(100)]
def flush_once():
    for r in names:
        for _ in range(10):
            with r: pass
    t = clock(); reporter.flush(); return clock() - t

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))
def step():
    nn.functional.cross_entropy(model(x), y).backward(); opt.step(); opt.zero_grad()
def steps(n):
    for _ in range(n): step()

rows = {}
e = best(empty, 20000)
rows["with timed() (ns)"] = best(with_region, 20000) - e
rows["two nested regions (ns)"] = best(nested, 20000) - e
rows["@timed call (ns)"] = best(calls_decorated, 20000) - best(calls_plain, 20000)
rows["flush, 100 paths x 10 calls (us)"] = min(flush_once() for _ in range(30)) / 1e3
bare = best(steps, 50, 5)
with instrument.auto(model, opt, every=50, sinks=[]):
    rows["auto on a tiny MLP step (us)"] = (best(steps, 50, 5) - bare) / 1e3
rows["C accelerator"] = _native.speedups is not None
print(json.dumps(rows))
"""


def measure(checkout: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": checkout}
    done = subprocess.run(  # run in the checkout: `python -c` puts the cwd first on sys.path
        [sys.executable, "-c", PROBE],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {args.before: [], args.after: []}
    for _ in range(args.rounds):
        for checkout in (args.before, args.after):
            runs[checkout].append(measure(checkout))
    for checkout, rounds in runs.items():
        if not all(r.pop("C accelerator") for r in rounds):
            sys.exit(f"{checkout}: the C accelerator is not built there (setup.py build_ext)")
    print(f"| what | before | after | after / before |  ({args.rounds} rounds, medians)")
    print("| --- | ---: | ---: | ---: |")
    for row in runs[args.before][0]:
        old = statistics.median(r[row] for r in runs[args.before])
        new = statistics.median(r[row] for r in runs[args.after])
        print(f"| {row} | {old:.1f} | {new:.1f} | {new / old:.2f} |")


if __name__ == "__main__":
    main()
