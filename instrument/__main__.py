"""``python -m instrument show | diff | plot``: see :mod:`instrument.cli`."""

from instrument.cli import main

raise SystemExit(main())
