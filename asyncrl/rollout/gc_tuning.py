"""Garbage-collector settings for a process that runs episodes on its event loop.

Measured on `benchmarks/straggler.py` (2 cores, 64 concurrent episodes): the episode path makes no
cyclic garbage in steady state (a collection over 2 s of it found none; reference counting frees
everything), yet CPython's generation-0 collections still ran every ~0.4 s and took 2-8 ms each,
~50 µs of event-loop CPU per episode. The allocation counter that triggers them advances slowly
(objects from earlier generations dying offset new ones), while every young object still alive,
the in-flight episodes' conversations and requests, is walked at each collection. Start-up leaves
the older generations full too (JAX, the model, configs: hundreds of thousands of objects), and
each full collection walks them all again.

`tune_for_rollout()` is called once, after start-up and before the loop starts: it collects once,
freezes what survives (`gc.freeze`: start-up objects leave the collector's view for good; cyclic
garbage made of them later is never freed, so call it after start-up, not before) and raises the
generation-0 threshold, which cut the collector's share to ~4 µs per episode there. Cyclic garbage
is still collected, only in larger batches. Nothing here runs at import.

`tuned_for_rollout()` does the same for the duration of a block and then restores the collector's
thresholds and unfreezes the heap: the train stage runs its event loop under it, so a stage run
inside a longer-lived process (the tests, a notebook) leaves that process's collector as it found
it. (A heap that was already frozen before the block stays frozen: `gc` cannot unfreeze part of
it.)
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

GEN0_THRESHOLD = 10_000  # CPython's default is 700


def tune_for_rollout(gen0_threshold: int = GEN0_THRESHOLD) -> None:
    """Collect, freeze the start-up heap and raise the generation-0 threshold (process-wide)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)


@contextlib.contextmanager
def tuned_for_rollout(gen0_threshold: int = GEN0_THRESHOLD) -> Iterator[None]:
    """`tune_for_rollout()` for the block; the thresholds and an unfrozen heap come back after."""
    thresholds = gc.get_threshold()
    was_frozen = gc.get_freeze_count() > 0
    tune_for_rollout(gen0_threshold)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if not was_frozen:
            gc.unfreeze()
