"""Where reports go: the console tree, Python logging, memory, or any ``write(report)``."""

from instrument.sinks.base import CallableSink, Sink, as_sink
from instrument.sinks.console import Console
from instrument.sinks.logging import Logging
from instrument.sinks.memory import InMemory

__all__ = ["CallableSink", "Console", "InMemory", "Logging", "Sink", "as_sink"]
