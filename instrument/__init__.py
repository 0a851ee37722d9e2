"""instrument: where did this step's time go, on which rank?

Nested timing trees for PyTorch training, from ``@timed`` / ``with timed(...)`` regions,
at a cost close to reading the clock and without synchronizing the device.
"""

from instrument import exit_summary as _exit_summary  # noqa: F401 - the tree at exit without a Reporter
from instrument import sinks
from instrument import tree as _tree  # noqa: F401 - registers Report.render's text renderer
from instrument.auto import AutoHandle, auto
from instrument.clocks import Clock
from instrument.config import configure, disable, enable, is_enabled
from instrument.distributed import barrier_region as _barrier_region  # noqa: F401 - timed(barrier=True)
from instrument.hooks.data import data
from instrument.regions.frames import current_path
from instrument.regions.region import Region
from instrument.regions.timed import timed
from instrument.regions.timer import Timer, timer
from instrument.report import Node, Report
from instrument.reporter import Reporter, count, step
from instrument.stats import Stats
from instrument.throughput import Throughput

__version__ = "0.1.0"

__all__ = [
    "AutoHandle",
    "Clock",
    "Node",
    "Region",
    "Report",
    "Reporter",
    "Stats",
    "Throughput",
    "Timer",
    "__version__",
    "auto",
    "configure",
    "count",
    "current_path",
    "data",
    "disable",
    "enable",
    "is_enabled",
    "sinks",
    "step",
    "timed",
    "timer",
]
