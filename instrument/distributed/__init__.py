"""Across ranks: the cross-rank gather of reports (:mod:`instrument.distributed.gather`),
barriers that time out instead of hanging, and the distributed helpers of NeMo Automodel's
``distributed.utils``."""

from instrument.distributed.barrier import barrier_with_timeout, metadata_group
from instrument.distributed.helpers import (
    FirstRankPerNode,
    barrier_and_log,
    dp_eval_sample_shard,
    get_sync_ctx,
    log_rank_0,
    print_rank_0,
    reduce_loss,
)

__all__ = [
    "FirstRankPerNode",
    "barrier_and_log",
    "barrier_with_timeout",
    "dp_eval_sample_shard",
    "get_sync_ctx",
    "log_rank_0",
    "metadata_group",
    "print_rank_0",
    "reduce_loss",
]
