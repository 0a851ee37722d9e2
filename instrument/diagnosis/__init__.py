"""Diagnosis: each report's findings (what it means, what to try) and the run's summary.

See docs/diagnosis.md for every kind of finding, what raises it and its thresholds.
"""

from instrument.diagnosis.engine import Diagnosis, diagnose
from instrument.diagnosis.summary import RunSummary
from instrument.diagnosis.thresholds import Thresholds
from instrument.findings import KINDS, SEVERITIES, Finding

__all__ = ["KINDS", "SEVERITIES", "Diagnosis", "Finding", "RunSummary", "Thresholds", "diagnose"]
