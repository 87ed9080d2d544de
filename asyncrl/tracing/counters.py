"""Periodic samples of the loop's gauges onto the trace's counter tracks.

Runs as an asyncio task beside the training loop: active episodes, engine slots in use, ready and
half-filled groups, generated tokens per second, and the process's resident memory. (Policy lag is
recorded by the loop at each step.) The memory high-water mark is kept for the run's metrics.
"""

from __future__ import annotations

import asyncio
import resource
import time

from asyncrl import tracing


def rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc; the peak where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_rss_bytes() -> int:
    """The process's memory high-water mark (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class CounterSampler:
    def __init__(self, engine, orchestrator, queue, interval_s: float) -> None:
        self.engine, self.orchestrator, self.queue = engine, orchestrator, queue
        self.interval_s = interval_s
        self.peak_rss = 0

    def sample(self, last: tuple[float, int]) -> tuple[float, int]:
        tracer = tracing.get()
        stats = self.queue.stats()
        now, tokens = time.monotonic(), self.engine.stats.generated_tokens
        rss = rss_bytes()
        self.peak_rss = max(self.peak_rss, rss)
        tracer.counter("active episodes", self.orchestrator.active)
        tracer.counter("engine slots in use", self.engine.slots_in_use)
        tracer.counter("ready groups", stats.ready)
        tracer.counter("half-filled groups", stats.half_filled)
        tracer.counter("tokens/s", (tokens - last[1]) / max(now - last[0], 1e-9))
        tracer.counter("host memory", rss)
        return now, tokens

    async def run(self) -> None:
        last = (time.monotonic(), self.engine.stats.generated_tokens)
        while True:
            last = self.sample(last)
            await asyncio.sleep(self.interval_s)
