"""Where reports go: the console tree, Python logging, memory, JSON lines, TensorBoard,
wandb, MLflow, OpenTelemetry, trace files, or any ``write(report)``."""

from instrument.sinks.adapt import CallableSink, as_sink
from instrument.sinks.base import Sink
from instrument.sinks.console import Console
from instrument.sinks.jsonl import JSONL
from instrument.sinks.logging import Logging
from instrument.sinks.memory import InMemory
from instrument.sinks.mlflow import MLflow
from instrument.sinks.otel import OpenTelemetry
from instrument.sinks.tensorboard import TensorBoard
from instrument.sinks.trace import ChromeTrace
from instrument.sinks.wandb import WandB

__all__ = [
    "JSONL",
    "CallableSink",
    "ChromeTrace",
    "Console",
    "InMemory",
    "Logging",
    "MLflow",
    "OpenTelemetry",
    "Sink",
    "TensorBoard",
    "WandB",
    "as_sink",
]
