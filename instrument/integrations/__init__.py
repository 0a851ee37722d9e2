"""Adapters that put :func:`instrument.auto` inside third-party trainers, one module per
trainer, each imported only when used (``instrument.integrations.lightning``, ...)."""
