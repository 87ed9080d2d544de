"""Trajectories into device batches: the one place a `TrainBatch` is built.

Each trajectory becomes one row: inputs are its tokens but the last, targets its tokens but the
first; a target counts in the loss when the model sampled it (loss mask 1) and its trajectory is
not excluded (e.g. truncated, with `mask_truncated`). Rows are padded to a length bucket and packed
into micro-batches of a fixed number of rows (a token budget), assigned so that every micro-batch
carries about the same Σ L² (attention cost grows with the square of the length). Shapes depend
only on the bucket, so a training run compiles a handful of step functions. With k mini-batches
(several optimizer updates per batch) the number of micro-batches is a multiple of k and mini-batch
j is the j-th run of consecutive micro-batches; every micro-batch holds at least one trajectory.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from flax import struct

from asyncrl.types import Trajectory, TrajectoryStatus

TRUNCATED = frozenset({TrajectoryStatus.TRUNCATED_TOKENS, TrajectoryStatus.TRUNCATED_STEPS})
MIN_BUCKET = 64


@struct.dataclass
class TrainBatch:
    """M micro-batches of R rows of T tokens (M, R, T static for a given bucket)."""

    inputs: jax.Array  # [M, R, T] int32
    targets: jax.Array  # [M, R, T] int32
    positions: jax.Array  # [M, R, T] int32
    valid: jax.Array  # [M, R, T] bool: real (non-padding) input tokens
    mask: jax.Array  # [M, R, T] float32: targets that count in the loss
    behaviour: jax.Array  # [M, R, T] float32: engine log-probs of the targets
    advantages: jax.Array  # [M, R] float32
    n_sequences: jax.Array  # [] float32: rows with at least one counted token (B)
    n_tokens: jax.Array  # [] float32: counted tokens in the whole batch (N)
    no_signal_share: jax.Array  # [] float32: share of the batch's groups whose rewards are equal


def bucket_length(n: int, max_len: int) -> int:
    """n rounded up to a multiple of MIN_BUCKET, capped at max_len: few shapes, little padding."""
    return min(-(-max(n, 1) // MIN_BUCKET) * MIN_BUCKET, max_len)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def assign_rows(lengths: Sequence[int], n_micro: int, rows: int) -> list[list[int]]:
    """Row indices per micro-batch: longest first, each to the bin with the least Σ L² so far."""
    loads = [0] * n_micro
    bins: list[list[int]] = [[] for _ in range(n_micro)]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        open_bins = [b for b in range(n_micro) if len(bins[b]) < rows]
        b = min(open_bins, key=lambda b: loads[b])
        bins[b].append(i)
        loads[b] += lengths[i] ** 2
    return bins


def build_batch(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[float],
    *,
    max_len: int,
    micro_batch_tokens: int,
    mask_truncated: bool = False,
    rows: int | None = None,
    minibatches: int = 1,
    no_signal_share: float = 0.0,
    row_multiple: int = 1,
) -> TrainBatch:
    """Pack trajectories (with their advantages) into a TrainBatch; `rows` overrides the budget.

    `row_multiple`: rows per micro-batch are rounded up to a multiple of it (the learner's data
    parallelism, so every device gets an equal share of each micro-batch's rows)."""
    if len(trajectories) != len(advantages):
        raise ValueError("one advantage per trajectory")
    if len(trajectories) < minibatches:
        raise ValueError(f"{len(trajectories)} trajectories cannot fill {minibatches} mini-batches")
    longest = max(len(t.tokens) for t in trajectories) - 1
    width = bucket_length(longest, max_len)
    if longest > width:
        raise ValueError(f"a trajectory of {longest + 1} tokens exceeds max_len={max_len}")
    n = len(trajectories)
    rows = rows or max(1, min(_ceil_div(n, minibatches), micro_batch_tokens // width))
    rows = _ceil_div(rows, row_multiple) * row_multiple
    n_micro = _ceil_div(_ceil_div(n, rows), minibatches) * minibatches
    if n_micro > n:
        raise ValueError(f"{rows} rows per micro-batch leave a mini-batch without trajectories")
    bins = assign_rows([len(t.tokens) for t in trajectories], n_micro, rows)
    batch = empty_batch((n_micro, rows, width))
    for m, members in enumerate(bins):
        for r, i in enumerate(members):
            traj, n = trajectories[i], len(trajectories[i].tokens) - 1
            if n < 1:  # fewer than two tokens: no target to predict, the row stays padding
                continue
            tokens = np.asarray(traj.tokens, np.int32)
            batch.inputs[m, r, :n] = tokens[:-1]
            batch.targets[m, r, :n] = tokens[1:]
            batch.valid[m, r, :n] = True
            if not (mask_truncated and traj.status in TRUNCATED):
                batch.mask[m, r, :n] = np.asarray(traj.loss_mask[1:], np.float32)
            batch.behaviour[m, r, :n] = np.asarray(traj.logprobs[1:], np.float32)
            batch.advantages[m, r] = advantages[i]
    counted = batch.mask.sum(-1) > 0
    return batch.replace(
        n_sequences=np.float32(max(counted.sum(), 1)),
        n_tokens=np.float32(batch.mask.sum()),
        no_signal_share=np.float32(no_signal_share),
    )


def empty_batch(shape: tuple[int, int, int]) -> TrainBatch:
    """M x R x T of padding (host arrays, no counted token): what `build_batch` fills in, and
    what a follower process receives a batch into (`learner/lockstep.py`)."""
    m, r, t = shape
    positions = np.broadcast_to(np.arange(t, dtype=np.int32), shape)
    return TrainBatch(
        inputs=np.zeros(shape, np.int32),
        targets=np.zeros(shape, np.int32),
        positions=np.ascontiguousarray(positions),
        valid=np.zeros(shape, bool),
        mask=np.zeros(shape, np.float32),
        behaviour=np.zeros(shape, np.float32),
        advantages=np.zeros((m, r), np.float32),
        n_sequences=np.float32(1),
        n_tokens=np.float32(0),
        no_signal_share=np.float32(0),
    )
