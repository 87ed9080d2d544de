"""Host-side arrays the engine ships to the device each step: per-slot sampling parameters,
prefill batches, and PRNG key data. Plain NumPy; nothing here touches a device."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from asyncrl.sampling.strategies import RowParams
from asyncrl.types import SamplingParams


def key_data(seed: int) -> np.ndarray:
    """Threefry key data for a seed, built on the host (no device op, nothing to compile)."""
    seed = int(seed) & ((1 << 64) - 1)
    return np.asarray([seed >> 32, seed & 0xFFFFFFFF], np.uint32)


class PrefillBatch:
    """Host arrays of one prefill call: `rows` rows of `width` tokens; unused rows stay inert."""

    def __init__(self, rows: int, width: int, max_len: int) -> None:
        self.slots = np.arange(rows, dtype=np.int32)
        self.tokens = np.zeros((rows, width), np.int32)
        self.starts = np.full(rows, max_len, np.int32)  # inert rows write past the cache end
        self.n_valid = np.zeros(rows, np.int32)
        self.reset = np.zeros(rows, bool)
        self.final = np.zeros(rows, bool)

    def put(self, row: int, slot: int, chunk: Sequence[int], start: int, *, reset, final) -> None:
        self.slots[row] = slot
        self.tokens[row, : len(chunk)] = chunk
        self.starts[row] = start
        self.n_valid[row] = len(chunk)
        self.reset[row] = reset
        self.final[row] = final


class RowArrays:
    """Per-slot sampling parameters as host arrays, shipped to the device each step."""

    def __init__(self, n: int) -> None:
        self.temperature = np.ones(n, np.float32)
        self.top_k = np.zeros(n, np.int32)
        self.top_p = np.ones(n, np.float32)
        self.min_p = np.zeros(n, np.float32)
        self.repetition_penalty = np.ones(n, np.float32)

    def set(self, i: int, p: SamplingParams) -> RowParams:
        self.temperature[i] = p.temperature
        self.top_k[i] = p.top_k
        self.top_p[i] = p.top_p
        self.min_p[i] = p.min_p
        self.repetition_penalty[i] = p.repetition_penalty
        return self.row_of(i)

    def row_of(self, i: int) -> RowParams:
        sl = slice(i, i + 1)
        return RowParams(
            temperature=self.temperature[sl],
            top_k=self.top_k[sl],
            top_p=self.top_p[sl],
            min_p=self.min_p[sl],
            repetition_penalty=self.repetition_penalty[sl],
        )

    def all(self) -> RowParams:
        return RowParams(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
        )
