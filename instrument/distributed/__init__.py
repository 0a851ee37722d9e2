"""Across ranks: the cross-rank step of a flush (:mod:`instrument.distributed.across`:
agree on the store, then reductions), barriers that time out instead of hanging, the
all-gather Megatron's ``Timers.log`` needs (:mod:`instrument.distributed.gather`), and the
distributed helpers of NeMo Automodel's ``distributed.utils``."""

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
