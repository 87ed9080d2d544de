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
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 10_000  # CPython's default is 700


def tune_for_rollout(gen0_threshold: int = GEN0_THRESHOLD) -> None:
    """Collect, freeze the start-up heap and raise the generation-0 threshold (process-wide)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0_threshold, gen1, gen2)
