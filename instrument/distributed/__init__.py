"""Across ranks: the cross-rank gather of reports, barriers that time out instead of hanging,
and the distributed helpers of NeMo Automodel's ``distributed.utils``."""
