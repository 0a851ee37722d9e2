"""Real training runs with one problem injected each, for the diagnosis tests.

Not collected by pytest (``norecursedirs``); ``tests/test_diagnosis_scenarios.py`` runs them.
By hand, from ``tests/`` (so that ``scenarios`` and the checkout's ``instrument`` import)::

    PYTHONPATH=.. python -m scenarios.single_rank OUTDIR
    PYTHONPATH=.. python -m scenarios.two_ranks OUTDIR
    PYTHONPATH=.. python -m scenarios.figures OUTDIR
"""
