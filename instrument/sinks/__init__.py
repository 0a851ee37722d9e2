"""Where reports go: the console tree, Python logging, memory, trace files, or any
``write(report)``."""

from instrument.sinks.base import CallableSink, Sink, as_sink
from instrument.sinks.console import Console
from instrument.sinks.logging import Logging
from instrument.sinks.memory import InMemory
from instrument.sinks.trace import ChromeTrace

__all__ = ["CallableSink", "ChromeTrace", "Console", "InMemory", "Logging", "Sink", "as_sink"]
