"""Where timings come from without code changes: module, backward, optimizer, data and
collective hooks, installed together by :func:`instrument.auto`."""
