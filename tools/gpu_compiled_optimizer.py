"""The compiled-optimizer recipe on a GPU, interval by interval: what the xfail in
``tests/test_cuda_stacks.py`` saw (torch 2.11, H100: ``optimizer``'s device time 0 in two of
three intervals, ~57 ms of host time a step), printed so it can be seen on a machine with a GPU.

    python tools/gpu_compiled_optimizer.py

For each interval of 2 steps: the ``optimizer`` line's host and device totals (ms), then
Dynamo's graph count, graph breaks and recompilations of the run.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
    import torch
    from models import TinyLM, lm_loss
    from torch._dynamo.utils import counters

    import instrument
    from instrument.sinks import InMemory

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    warnings.simplefilter("ignore")
    torch._dynamo.reset()
    counters.clear()
    model = TinyLM().cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sink = InMemory()

    @torch.compile
    def step() -> None:
        opt.step()

    def tokens(seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return torch.randint(0, 64, (4, 16), generator=gen).cuda()

    with instrument.auto(model, opt, every=2, sinks=[sink], collectives=False, clock="cuda"):
        for i in range(8):
            lm_loss(model, tokens(i)).backward()
            step()
            opt.zero_grad()
    print(torch.__version__, torch.cuda.get_device_name())
    for report in sink.reports:
        node = report["optimizer"]
        device = None if node.device is None else round(node.device.total * 1e3, 3)
        print(f"steps {report.steps}: host {node.host.total * 1e3:.3f} ms, device {device} ms")
    print("graphs:", dict(counters["stats"]))
    print("recompiles:", sum(counters["recompiles"].values()) if "recompiles" in counters else 0)
    for why, n in counters["graph_break"].items():
        print(f"break x{n}:", " ".join(why.split())[:160])


if __name__ == "__main__":
    main()
