"""Adapters that put ``instrument.auto`` into third-party trainers, one module each.

Each is imported only when used (``import instrument.integrations.transformers``), so
``import instrument`` never imports transformers, lightning or accelerate. Accelerate
needs no adapter: ``auto`` takes what ``accelerator.prepare(...)`` returns.
"""
