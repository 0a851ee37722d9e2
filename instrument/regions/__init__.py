"""Regions: the hot path of ``instrument``, one idea per module.

- :mod:`~instrument.regions.frames` — the region stack of each context and the state machine
  of a region's life (enter, exit, exit by token, record); the definition the C path follows.
- :mod:`~instrument.regions.region` — region objects, one cached per key, whose class follows
  the configuration.
- :mod:`~instrument.regions.decorators` — timing each call (or resumption) of a function.
- :mod:`~instrument.regions.timed` — the public ``timed()`` factory.
- :mod:`~instrument.regions.timer` — manual ``Timer`` (start/stop).
- :mod:`~instrument.regions.span` — ``Span``: work timed outside the stack.
- :mod:`~instrument.regions.native` — every place where the C accelerator replaces Python.

Regions entered behind a barrier (``timed(name, barrier=True)``) live with the distributed
layer, in :mod:`instrument.distributed.barrier_region`.
"""
