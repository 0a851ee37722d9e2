"""``python -m instrument watch``: a live view of a run from the JSONL files it writes."""

from instrument.watch.loop import watch

__all__ = ["watch"]
