"""Drop-in APIs of the timers users migrate from: change one import, keep the calls.

``instrument.compat.megatron`` (Megatron-LM / NeMo ``Timers``), ``.deepspeed``
(``SynchronizedWallClockTimer``, ``ThroughputTimer``), ``.bing_bert`` (DeepSpeedExamples'
``timer.py``), ``.kempnerforge`` (``CUDATimerCollection``) and ``.nanotron``
(``nanotron_timer``). Each keeps its system's documented numbers and units; with
:func:`to_registry` (or ``to_registry=True`` on a timer collection) every start/stop is
also a region of the ``instrument`` timing tree, so the same timings reach reporters,
trees and sinks.
"""

from instrument.compat.feed import RegistryFeed, feeds_registry, to_registry

__all__ = ["RegistryFeed", "feeds_registry", "to_registry"]
