"""The distributed helpers of NeMo Automodel's ``components/distributed/utils.py``.

:class:`FirstRankPerNode` lets one rank per node run a block (a download, a cache build)
before the others; :func:`barrier_and_log`, :func:`print_rank_0` and :func:`log_rank_0`
keep logs readable; :func:`reduce_loss` and :func:`get_sync_ctx` are the gradient-accumulation
plumbing of a training step; :func:`dp_eval_sample_shard` says whether evaluation samples
may be split across data-parallel ranks. Each works without a process group (one process),
and every collective here runs with instrument's collective timing suppressed.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

from instrument.distributed.barrier import (
    Place,
    barrier_with_timeout,
    dist_initialized,
    next_seq,
    place_of,
    store_append,
    timeout_seconds,
)
from instrument.hooks.collectives import suppressed
from instrument.rank import rank as _rank

if TYPE_CHECKING:
    from types import TracebackType

    from torch.distributed import ProcessGroup

logger = logging.getLogger("instrument")

#: The torchrun variables :class:`FirstRankPerNode` needs to start a group by itself.
BOOTSTRAP_ENV = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")

#: How long the ranks wait for each other to read a failed block's errors (seconds).
_ACK_SECONDS = 60.0

#: Distributed strategies :func:`dp_eval_sample_shard` knows by name.
STRATEGIES = ("ddp", "fsdp", "fsdp2", "megatron_fsdp")


# -- FirstRankPerNode ----------------------------------------------------------------------


@dataclass
class _Frame:
    """One entry into a :class:`FirstRankPerNode` (the object may be entered again)."""

    created: bool = False  # this entry initialised the default group, and destroys it
    first: bool = True
    where: Place | None = None
    seq: int = 0


def _bootstrap() -> bool:
    """Start a gloo default group from torchrun's variables; True if one was started."""
    env = os.environ
    if not dist.is_available() or not all(env.get(key) for key in BOOTSTRAP_ENV):
        return False
    try:
        world_size = int(env["WORLD_SIZE"])
        rank = int(env["RANK"])
    except ValueError as exc:
        raise ValueError(
            f"FirstRankPerNode: WORLD_SIZE={env['WORLD_SIZE']!r} and RANK={env['RANK']!r} "
            "must be integers to start a process group"
        ) from exc
    if world_size < 2:
        return False
    dist.init_process_group("gloo", init_method="env://", world_size=world_size, rank=rank)
    return True


def _local_rank(where: Place) -> int:
    """This process's rank on its node: ``LOCAL_RANK``, else the global rank modulo
    ``LOCAL_WORLD_SIZE``, else (no torchrun variables: one node) the rank in the group."""
    env = os.environ
    if env.get("LOCAL_RANK"):
        return int(env["LOCAL_RANK"])
    if env.get("LOCAL_WORLD_SIZE"):
        return where.rank % int(env["LOCAL_WORLD_SIZE"])
    return where.ranks.index(where.rank)


class FirstRankPerNode(contextlib.ContextDecorator):
    """Run a block on the first rank of each node, then on the other ranks.

    ``__enter__`` returns True on each node's local rank 0 (``LOCAL_RANK``, else the global
    rank modulo ``LOCAL_WORLD_SIZE``, else — no torchrun variables — the rank in ``group``),
    which runs the block at once, while the other ranks wait in ``__enter__`` until every
    first rank has finished; then they run it and ``__enter__`` returns False to them. Use
    it for work whose result the others reuse: a download, a tokenised cache.

    - Without a process group it returns True and does nothing else. When none is
      initialised but torchrun's variables are set (``WORLD_SIZE`` > 1, ``RANK``,
      ``MASTER_ADDR``, ``MASTER_PORT``), it starts a gloo group for the block and destroys
      it on exit, after a final barrier of all ranks (as earlier NeMo Automodel did).
    - If the block raises on a first rank, the error is logged and re-raised there, and no
      other rank goes on: the waiting ranks' ``__enter__`` raises ``RuntimeError`` naming
      the rank and the exception (they never run the block), right after the first ranks
      finish, and the first ranks of other nodes, whose block succeeded, raise it from
      ``__exit__``. Uncaught, this ends every process: the job stops instead of hanging
      (NeMo Automodel aborts the job here).
    - The waiting ranks wait at most ``timeout`` (default 10 hours, like NeMo Automodel);
      past it their ``__enter__`` raises ``RuntimeError`` rather than running the block
      without the first rank's result.

    The waits are :func:`~instrument.distributed.barrier_with_timeout` calls, one per rank
    of ``group`` per entry, so every rank of ``group`` must enter the block. Ranks of a
    node with no member of ``group`` at local rank 0 all wait, then run it together.

    Args:
        group: The process group whose ranks take part (default: the world).
        timeout: The longest wait, as a ``timedelta`` or in seconds.

    Example:
        >>> with FirstRankPerNode() as first:
        ...     dataset = load_dataset(name)  # downloads on one rank per node, then cached
        >>> @FirstRankPerNode()
        ... def build_cache() -> None: ...
    """

    def __init__(
        self,
        group: ProcessGroup | None = None,
        timeout: datetime.timedelta | float = datetime.timedelta(hours=10),
    ) -> None:
        timeout_seconds(timeout)  # validate now, not on first use
        self.group = group
        self.timeout = timeout
        self._frames: list[_Frame] = []

    def __enter__(self) -> bool:
        frame = _Frame()
        if not dist_initialized():
            frame.created = _bootstrap()
        where = place_of(self.group) if dist_initialized() else None
        if where is None or len(where.ranks) == 1:
            self._frames.append(frame)
            return True
        frame.where = where
        frame.seq = next_seq("first_rank", where)
        frame.first = _local_rank(where) == 0
        self._frames.append(frame)
        if frame.first:
            return True
        problem = self._wait_for_first_ranks(frame)
        if problem is None:
            return False
        self._frames.pop()  # __exit__ is not called when __enter__ raises
        try:
            self._close(frame)
        finally:
            raise RuntimeError(problem)

    def _wait_for_first_ranks(self, frame: _Frame) -> str | None:
        """Wait until the first ranks finish the block; what went wrong, if anything."""
        assert frame.where is not None
        rank = frame.where.rank
        if not barrier_with_timeout(self.timeout, self.group):
            return (
                f"FirstRankPerNode: rank {rank} stopped waiting for the first rank of each "
                f"node to finish the block (timeout {timeout_seconds(self.timeout):g} s; the "
                "barrier warning above says which ranks did not arrive, or why it failed); not "
                "running it here"
            )
        try:
            failed = self._failures(frame)
        except Exception as exc:
            return f"FirstRankPerNode: rank {rank} could not read the first ranks' result: {exc}"
        if failed:
            return f"FirstRankPerNode: the block raised ({failed}); not running it on rank {rank}"
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        frame = self._frames.pop()
        problem = ""
        try:
            if frame.first and frame.where is not None:
                if exc_type is not None:
                    self._report_failure(frame, exc_type, exc)
                if barrier_with_timeout(self.timeout, self.group):  # release the others
                    failed = self._failures(frame, quiet=True)
                    if failed and exc_type is None:
                        problem = (
                            f"FirstRankPerNode: the block raised on another node ({failed}); "
                            f"stopping rank {frame.where.rank} too"
                        )
        finally:
            self._close(frame)
        if problem:
            raise RuntimeError(problem)

    def _failures(self, frame: _Frame, quiet: bool = False) -> str:
        """After the release barrier, on every rank: the first ranks' errors ("" if none).

        When there are some, every rank meets once more before going on, so that no rank
        (rank 0 hosts the store) exits while another is still reading them. ``quiet``:
        an unreadable store counts as no error instead of raising.
        """
        assert frame.where is not None
        key = f"instrument/first_rank/{frame.where.name}/{frame.seq}/failed"
        try:
            store = frame.where.store
            failed = store.get(key).decode().strip() if store.check([key]) else ""
        except Exception:
            if quiet:
                return ""
            raise
        if failed:
            barrier_with_timeout(min(timeout_seconds(self.timeout), _ACK_SECONDS), self.group)
        return failed.replace("\n", "; ")

    def _report_failure(
        self, frame: _Frame, exc_type: type[BaseException], exc: BaseException | None
    ) -> None:
        assert frame.where is not None
        rank = frame.where.rank
        logger.error(
            "instrument: the block of FirstRankPerNode raised on rank %d (%s: %s); the "
            "other ranks will raise instead of going on",
            rank,
            exc_type.__name__,
            exc,
        )
        line = f"rank {rank}: {exc_type.__name__}: {exc}".replace("\n", " ")
        key = f"instrument/first_rank/{frame.where.name}/{frame.seq}/failed"
        try:
            store_append(frame.where.store, key, line + "\n")
        except Exception:  # the store is gone: the others fail on their barrier instead
            pass

    @staticmethod
    def _close(frame: _Frame) -> None:
        """Destroy the group this entry started, after a barrier of all its ranks."""
        if not frame.created or not dist_initialized():
            return
        try:
            with suppressed():
                dist.barrier()
        finally:
            dist.destroy_process_group()


# -- logging -------------------------------------------------------------------------------


def print_rank_0(*args: Any, **kwargs: Any) -> None:
    """``print(*args, **kwargs)`` on global rank 0 only; always without a process group."""
    if _rank() == 0:
        print(*args, **kwargs)


def log_rank_0(
    message: str, level: int = logging.INFO, logger: logging.Logger | str | None = None
) -> None:
    """Log ``message`` at ``level`` on global rank 0 only (always without a process group),
    to ``logger`` (a logger or its name; default ``"instrument"``)."""
    if _rank() != 0:
        return
    if logger is None:
        target = logging.getLogger("instrument")
    elif isinstance(logger, str):
        target = logging.getLogger(logger)
    else:
        target = logger
    target.log(level, message, stacklevel=2)


def barrier_and_log(
    message: str, *, timeout: datetime.timedelta | float = datetime.timedelta(minutes=30)
) -> None:
    """Wait for every rank (:func:`~instrument.distributed.barrier_with_timeout`, default
    30 minutes), then log ``[message] datetime: YYYY-mm-dd HH:MM:SS`` at INFO on rank 0.

    A timed-out barrier logs the missing ranks and the message is logged anyway. Every rank
    must call it (it is a barrier). Without a process group it only logs.
    """
    barrier_with_timeout(timeout)
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    log_rank_0(f"[{message}] datetime: {now}")


# -- training step -------------------------------------------------------------------------


def reduce_loss(
    loss_store: list[torch.Tensor],
    total_num_tokens: torch.Tensor | int,
    per_token_loss: bool = True,
    dp_group: ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum the micro-batch losses of a step and their denominator, over ``dp_group``.

    The loss is the sum of ``loss_store`` as a float32 tensor of shape ``(1,)``, detached.
    The denominator is ``total_num_tokens`` when ``per_token_loss`` (as an int32 tensor, its
    shape kept; an int becomes shape ``(1,)``), else the number of losses (micro-batches),
    shape ``(1,)``. Both are all-reduced (SUM) over ``dp_group`` when one is given; with
    ``dp_group=None`` nothing is reduced, as in NeMo Automodel. The caller divides:
    ``loss / denominator`` is the step's mean loss.

    Both live on the losses' device (NCCL needs CUDA tensors); a tensor
    ``total_num_tokens`` keeps its own device. Every rank of ``dp_group`` must call it.

    Example:
        >>> loss, tokens = reduce_loss(losses, num_label_tokens, dp_group=dp_group)
        >>> mean = (loss / tokens).item()
    """
    if not loss_store:
        raise ValueError("reduce_loss: loss_store is empty; pass the step's micro-batch losses")
    loss = torch.stack([t.detach() for t in loss_store]).float().sum().view(1).clone()
    if per_token_loss:
        if isinstance(total_num_tokens, torch.Tensor):
            denominator = total_num_tokens.detach().clone().to(torch.int)
        else:
            denominator = torch.tensor([int(total_num_tokens)], dtype=torch.int, device=loss.device)
    else:
        denominator = torch.tensor([len(loss_store)], dtype=torch.int, device=loss.device)
    if dp_group is not None:
        with suppressed():
            dist.all_reduce(loss, op=dist.ReduceOp.SUM, group=dp_group)
            dist.all_reduce(denominator, op=dist.ReduceOp.SUM, group=dp_group)
    return loss, denominator


def _fsdp_module_type() -> type | None:
    """``FSDPModule`` (FSDP2's ``fully_shard`` class) where this torch has it."""
    for module in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            found = getattr(importlib.import_module(module), "FSDPModule", None)
        except ImportError:
            continue
        if isinstance(found, type):
            return found
    return None


def get_sync_ctx(
    model: object, is_optim_step: bool, defer_fsdp_grad_sync: bool = True
) -> contextlib.AbstractContextManager[Any]:
    """The context to run a micro-batch's forward and backward in, for gradient accumulation.

    - FSDP2 (``fully_shard``): calls ``model.set_requires_gradient_sync(is_optim_step)``
      when ``defer_fsdp_grad_sync`` (reduce-scatter only on the optimizer step's
      micro-batch: less communication, more memory for the unsharded gradients), else
      ``set_requires_gradient_sync(True)`` (sync every micro-batch); returns a null context.
      The setting stays on the model until the next call — it is not restored.
    - Any model with a ``no_sync()`` method (DDP, FSDP1): ``model.no_sync()`` when this is
      not the optimizer step, so gradients accumulate locally; a null context on the step.
    - Anything else: a null context.

    Example:
        >>> for i, batch in enumerate(micro_batches):
        ...     with get_sync_ctx(model, is_optim_step=i == len(micro_batches) - 1):
        ...         model(batch).loss.backward()
    """
    fsdp = _fsdp_module_type()
    if fsdp is not None and isinstance(model, fsdp):
        sync = is_optim_step if defer_fsdp_grad_sync else True
        cast(Any, model).set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
    no_sync = getattr(model, "no_sync", None)
    if not is_optim_step and callable(no_sync):
        ctx: contextlib.AbstractContextManager[Any] = no_sync()
        return ctx
    return contextlib.nullcontext()


# -- evaluation ----------------------------------------------------------------------------


def _replicated(distributed_config: object) -> bool:
    """True for data parallelism that keeps a whole model per rank (DDP)."""
    if isinstance(distributed_config, str):
        name = distributed_config.lower()
        if name not in STRATEGIES:
            raise ValueError(
                f"unknown distributed strategy {distributed_config!r}; expected one of "
                f"{', '.join(map(repr, STRATEGIES))} or a config object"
            )
        return name == "ddp"
    if dist.is_available():
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(distributed_config, DistributedDataParallel):
            return True
    return any(cls.__name__ == "DDPConfig" for cls in type(distributed_config).__mro__)


def dp_eval_sample_shard(
    distributed_config: object, dp_rank: int, dp_size: int
) -> tuple[int, int] | None:
    """``(dp_rank, dp_size)`` when evaluation samples may be split across data-parallel
    ranks, else ``None`` (every rank evaluates every sample).

    Only DDP keeps the whole model on every rank, so only there can each rank score its own
    samples; under FSDP2 or Megatron-FSDP ``generate()`` runs per-layer all-gathers that must
    stay in lockstep, and different samples per rank would hang them. ``distributed_config``
    is NeMo Automodel's strategy config (a ``DDPConfig`` — matched by class name, NeMo is not
    imported — shards; ``FSDP2Config``, ``MegatronFSDPConfig`` and anything else do not), a
    strategy name (``"ddp"`` shards; ``"fsdp"``, ``"fsdp2"``, ``"megatron_fsdp"`` do not),
    or the wrapped model (a ``DistributedDataParallel`` shards). With ``dp_size == 1``
    there is nothing to split: ``None``.

    A common way to apply the shard is a strided slice, which splits the samples into
    disjoint parts covering them all; the per-rank results are then summed (all-reduce):

    Example:
        >>> shard = dp_eval_sample_shard("ddp", dp_rank=1, dp_size=4)   # (1, 4)
        >>> mine = samples[shard[0] :: shard[1]] if shard else samples
    """
    if dp_size < 1 or not 0 <= dp_rank < dp_size:
        raise ValueError(
            f"dp_rank must be in [0, dp_size) and dp_size >= 1, got dp_rank={dp_rank}, "
            f"dp_size={dp_size}"
        )
    replicated = _replicated(distributed_config)  # validates a strategy name
    return (dp_rank, dp_size) if replicated and dp_size > 1 else None
