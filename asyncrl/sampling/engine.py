"""The in-process continuous-batching engine serving many asyncio episodes.

A decode thread owns `slots` rows of one KV cache. Between two decode steps it applies a pending
weight publish, drops cancelled and timed-out requests, admits waiting requests into free slots
(chunked prefill padded to a few length buckets, reusing a session's cached prefix), advances every
busy slot by one token with one batched step, and retires finished requests by resolving their
futures on their own event loops. Shapes are static (slots × cache length; buckets; attention
windows), so serving compiles nothing after `warmup()`.

The engine knows nothing of tools, agents or training. It never blocks an event loop: the only
waits on the caller's side are asyncio awaits (admission backpressure and the result).

Why one class of ~480 lines: every mutation of the cache, the slot table and the per-slot arrays
happens on the decode thread inside these methods; splitting them across objects would spread
that single-writer invariant over several files. Host arrays live in `host_arrays.py`, device
steps in `steps.py`, slot bookkeeping in `slots.py`.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from asyncrl import tracing
from asyncrl.config import RolloutConfig
from asyncrl.model import Transformer, init_cache
from asyncrl.model.sharding import copy_state
from asyncrl.sampling.host_arrays import PrefillBatch, RowArrays, key_data
from asyncrl.sampling.protocol import EngineClosed, PromptTooLong
from asyncrl.sampling.slots import Slot, SlotTable
from asyncrl.sampling.stats import EngineStats
from asyncrl.sampling.steps import decode_step, prefill_step
from asyncrl.types import Completion, FinishReason, GenerateRequest


@dataclass(slots=True, eq=False)
class _Live:
    """A request inside the engine, from `generate` until its future is resolved."""

    request: GenerateRequest
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    release_admission: Callable[[], None]
    key: np.ndarray  # [2] uint32: the request's PRNG stream
    deadline: float
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    raw: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    cancelled: bool = False
    slot: Slot | None = None
    cached_tokens: int = 0


class Engine:
    def __init__(
        self,
        model: Transformer,
        cfg: RolloutConfig,
        *,
        max_len: int,
        vocab_limit: int | None = None,
        decode_text: Callable[[Sequence[int]], str] | None = None,
        seed: int = 0,
        version: int = 0,
        placement: jax.sharding.Sharding | None = None,
        device_lock: threading.Lock | None = None,
    ) -> None:
        self.cfg = cfg
        self.max_len = max_len
        self.vocab_limit = vocab_limit or model.cfg.vocab_size
        self.decode_text = decode_text
        # Where the engine's weights and cache live (the rollout devices); None = default device.
        self._placement = placement
        # Colocated placement: the learner holds this lock during a train step, pausing decoding.
        self._device_lock = device_lock or contextlib.nullcontext()
        # Parameters are what a publish replaces; the rest (RoPE tables) stays the engine's own.
        self._graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        self._state = (copy_state(params, placement), copy_state(rest, placement))
        self._version = version
        self._slots = SlotTable(cfg.engine_slots)
        self._buckets = tuple(b for b in cfg.prefill_buckets if b <= max_len) or (max_len,)
        self._windows = tuple(sorted({min(w, max_len) for w in cfg.attention_windows} | {max_len}))
        # Admissions at least this many at once are prefilled in one call over all slots.
        self._wide_threshold = max(2, cfg.engine_slots // 8)
        self._cache = init_cache(model.cfg, cfg.engine_slots, max_len)
        self._presence = jnp.zeros((cfg.engine_slots, model.cfg.vocab_size), bool)
        if placement is not None:
            self._cache, self._presence = jax.device_put((self._cache, self._presence), placement)
        n = cfg.engine_slots
        self._row_tokens = np.zeros(n, np.int32)
        self._row_pos = np.full(n, max_len, np.int32)
        self._row_keys = np.zeros((n, 2), np.uint32)
        self._row_params = RowArrays(n)
        self._live: dict[int, _Live] = {}  # slot index -> request decoding there
        self._waiting: deque[_Live] = deque()
        self._pending_publish: tuple[nnx.State, int] | None = None
        self._cv = threading.Condition()
        self._closed = False
        # Fresh seeds for requests without one: a per-engine stream, never repeated within it.
        self._seeds = itertools.count(int(np.random.SeedSequence(seed).generate_state(1)[0]) << 20)
        self._semaphores: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        self.stats = EngineStats()
        self._thread = threading.Thread(target=self._run, name="asyncrl-engine", daemon=True)
        self._thread.start()

    # -- the caller's side (any event loop) --------------------------------------------------------
    @property
    def slots_in_use(self) -> int:
        return len(self._live)

    @property
    def version(self) -> int:
        return self._version

    @property
    def exhausted(self) -> bool:
        """Closed (or its decode thread died): no request will be served again."""
        return self._closed

    async def generate(self, request: GenerateRequest) -> Completion:
        if not request.prompt:
            raise ValueError("a request needs at least one prompt token")
        if len(request.prompt) + 1 > self.max_len:
            raise PromptTooLong(
                f"prompt of {len(request.prompt)} tokens leaves no room in the context window of "
                f"{self.max_len} tokens"
            )
        if self._closed:
            raise EngineClosed("the engine is closed")
        loop = asyncio.get_running_loop()
        sem = self._semaphores.setdefault(loop, asyncio.Semaphore(self.cfg.engine_queue))
        await sem.acquire()
        seed = request.params.seed if request.params.seed is not None else next(self._seeds)
        timeout = request.timeout_s if request.timeout_s is not None else self.cfg.request_timeout_s
        live = _Live(
            request=request,
            loop=loop,
            future=loop.create_future(),
            release_admission=lambda: loop.call_soon_threadsafe(sem.release),
            key=key_data(seed),
            deadline=time.monotonic() + timeout,
        )
        with self._cv:
            if self._closed:
                sem.release()
                raise EngineClosed("the engine is closed")
            self._waiting.append(live)
            self._cv.notify()
        try:
            return await live.future
        except asyncio.CancelledError:
            live.cancelled = True
            with self._cv:
                self._cv.notify()
            raise

    def publish(self, params: nnx.State, version: int) -> None:
        """Use `params` (the model's nnx.Param state) from the next decode step on.

        The engine keeps its own copy, on its own devices.
        """
        owned = copy_state(params, self._placement)
        with self._cv:
            self._pending_publish = (owned, version)
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def warmup(self) -> None:
        """Compile every prefill shape (one row and all rows) and every decode window."""
        with self._cv:
            if self._live or self._waiting:
                raise RuntimeError("warm up before serving")
            for width, window in self._prefill_shapes():
                for rows in sorted({1, self.cfg.engine_slots}):
                    self._prefill_call(PrefillBatch(rows, width, self.max_len), window)
            for window in self._windows:
                for sort in (False, True):
                    self._decode(window, sort, np.zeros(self.cfg.engine_slots, bool))
            self._presence = jnp.zeros_like(self._presence)

    # -- the decode thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not (
                        self._closed or self._waiting or self._live or self._pending_publish
                    ):
                        self._cv.wait()
                    if self._closed:
                        break
                    publish, self._pending_publish = self._pending_publish, None
                    admit = self._take_waiting()
                with self._device_lock:
                    if publish is not None:
                        with tracing.span("engine", "swap weights", {"version": publish[1]}):
                            self._apply_publish(*publish)
                    self._reap()
                    if admit:
                        self._admit(admit)
                    if self._live:
                        self._step()
        except BaseException as e:  # a device error must fail requests, not hang them
            self._fail_all(e)
            raise
        self._fail_all(EngineClosed("the engine was closed"))

    def _take_waiting(self) -> list[_Live]:
        taken: list[_Live] = []
        free = self._slots.free_count()
        while self._waiting and len(taken) < free:
            live = self._waiting.popleft()
            live.release_admission()
            if live.cancelled:
                continue
            taken.append(live)
        return taken

    def _admit(self, lives: list[_Live]) -> None:
        """Give each request a slot, prefill them all, and record their first tokens."""
        admitted: list[_Live] = []
        now = time.monotonic()
        exact = None if self.cfg.in_flight_policy == "continue" else self._version
        for live in lives:
            if live.cancelled:
                continue
            if now > live.deadline:
                self._resolve(live, FinishReason.TIMEOUT)
                continue
            req = live.request
            slot, live.cached_tokens = self._slots.acquire(req.session, req.prompt, exact)
            live.slot = slot
            self._live[slot.index] = live
            self._row_params.set(slot.index, req.params)
            self._row_keys[slot.index] = live.key
            admitted.append(live)
        t0 = time.perf_counter()
        tracer = tracing.get()
        tracer.begin(tracer.track("engine"), "prefill", {"requests": len(admitted)})
        largest = self._buckets[-1]
        short = [x for x in admitted if len(x.request.prompt) - x.cached_tokens <= largest]
        wide = short if len(short) >= self._wide_threshold else []
        firsts = self._prefill_wide(wide) if wide else {}
        for live in admitted:
            if live not in firsts:
                firsts[live] = self._prefill_row(live.slot, live.request.prompt, live.cached_tokens)
        tracer.end(tracer.track("engine"))
        computed = sum(len(x.request.prompt) - x.cached_tokens for x in admitted)
        reused = sum(x.cached_tokens for x in admitted)
        self.stats.record_prefill(computed, reused, time.perf_counter() - t0)
        for live in admitted:
            self._accept(live, *firsts[live])

    def _prefill_shapes(self) -> list[tuple[int, int]]:
        """Every (bucket width, attention window) pair a prefill chunk can need."""
        return [(b, w) for b in self._buckets for w in self._windows if w >= b]

    def _window_for(self, end: int) -> int:
        return self._windows[bisect.bisect_left(self._windows, end)]

    def _bucket_for(self, length: int) -> int:
        return self._buckets[bisect.bisect_left(self._buckets, length)]

    def _prefill_row(self, slot: Slot, seq: Sequence[int], start: int, keep: bool = True):
        """Run seq[start:] into one slot in bucket-sized chunks; returns the token sampled last.

        `keep` False (recomputing a cache after a publish) discards that token.
        """
        largest = self._buckets[-1]
        pos, out = start, None
        while pos < len(seq):
            chunk = seq[pos : pos + largest]
            batch = PrefillBatch(1, self._bucket_for(len(chunk)), self.max_len)
            is_last = pos + len(chunk) == len(seq)
            batch.put(0, slot.index, chunk, pos, reset=pos == 0, final=is_last and keep)
            params = self._row_params.row_of(slot.index)
            keys = self._row_keys[slot.index : slot.index + 1]
            out = self._prefill_call(batch, self._window_for(pos + len(chunk)), params, keys)
            pos += len(chunk)
        self._note_cached(slot, seq, start)
        assert out is not None
        return out[0][0], out[1][0], out[2][0]

    def _prefill_wide(self, lives: list[_Live]) -> dict[_Live, tuple[int, float, float]]:
        """One call over all slots for prompts whose uncached part fits one bucket."""
        n = self.cfg.engine_slots
        longest = max(len(x.request.prompt) - x.cached_tokens for x in lives)
        batch = PrefillBatch(n, self._bucket_for(longest), self.max_len)
        for live in lives:
            i = live.slot.index
            batch.put(
                i,
                i,
                live.request.prompt[live.cached_tokens :],
                live.cached_tokens,
                reset=live.cached_tokens == 0,
                final=True,
            )
        end = max(len(x.request.prompt) for x in lives)
        tok, logp, raw = self._prefill_call(
            batch, self._window_for(end), self._row_params.all(), self._row_keys
        )
        for live in lives:
            self._note_cached(live.slot, live.request.prompt, live.cached_tokens)
        return {
            x: (int(tok[x.slot.index]), float(logp[x.slot.index]), float(raw[x.slot.index]))
            for x in lives
        }

    def _note_cached(self, slot: Slot, seq: Sequence[int], start: int) -> None:
        slot.cached = list(seq)
        slot.version = self._version if start == 0 else min(slot.version, self._version)

    def _prefill_call(self, batch: PrefillBatch, window: int, params=None, keys=None):
        rows = batch.tokens.shape[0]
        params = params if params is not None else RowArrays(rows).all()
        keys = keys if keys is not None else np.zeros((rows, 2), np.uint32)
        tok, logp, raw, self._cache, self._presence = prefill_step(
            self._graphdef,
            self._state,
            self._cache,
            self._presence,
            batch.slots,
            batch.tokens,
            batch.starts,
            batch.n_valid,
            batch.reset,
            batch.final,
            params,
            keys,
            np.zeros(rows, np.int32),
            window=window,
            vocab_limit=self.vocab_limit,
        )
        return np.asarray(tok), np.asarray(logp), np.asarray(raw)

    def _step(self) -> None:
        active = np.zeros(self.cfg.engine_slots, bool)
        for i in self._live:
            active[i] = True
        longest = int(self._row_pos[active].max()) + 1
        window = self._windows[bisect.bisect_left(self._windows, longest)]
        sort = bool(np.any(active & ((self._row_params.top_k > 0) | (self._row_params.top_p < 1))))
        t0 = time.perf_counter()
        tracer = tracing.get()
        tracer.begin(
            tracer.track("engine"), "decode", {"rows": int(active.sum()), "window": window}
        )
        tok, logp, raw = self._decode(window, sort, active)  # host arrays: the step is done
        tracer.end(tracer.track("engine"))
        self.stats.record_step(int(active.sum()), time.perf_counter() - t0)
        for i, live in list(self._live.items()):
            self._row_pos[i] += 1
            live.slot.cached.append(int(self._row_tokens[i]))
            self._accept(live, int(tok[i]), float(logp[i]), float(raw[i]))

    def _decode(self, window: int, sort: bool, active: np.ndarray):
        counters = np.asarray(
            [
                len(self._live[i].tokens) if i in self._live else 0
                for i in range(self.cfg.engine_slots)
            ],
            np.int32,
        )
        positions = np.where(active, self._row_pos, self.max_len).astype(np.int32)
        out = decode_step(
            self._graphdef,
            self._state,
            self._cache,
            self._presence,
            self._row_tokens,
            positions,
            active,
            self._row_params.all(),
            self._row_keys,
            counters,
            window=window,
            sort=sort,
            vocab_limit=self.vocab_limit,
        )
        tok, logp, raw, self._cache, self._presence = out
        return np.asarray(tok), np.asarray(logp), np.asarray(raw)

    def _accept(self, live: _Live, tok: int, logp: float, raw: float) -> None:
        """Record one sampled token and retire the request if it is finished."""
        live.tokens.append(tok)
        live.logprobs.append(logp)
        live.raw.append(raw)
        live.versions.append(self._version)
        slot = live.slot
        self._row_tokens[slot.index] = tok
        self._row_pos[slot.index] = len(slot.cached)
        reason = self._finish_reason(live)
        if reason is not None:
            self._retire(live, reason)

    def _finish_reason(self, live: _Live) -> FinishReason | None:
        p = live.request.params
        if live.tokens[-1] in p.stop_tokens:
            return FinishReason.STOP
        if p.stop_strings and self.decode_text is not None:
            tail = self.decode_text(live.tokens[-64:])
            if any(s in tail for s in p.stop_strings):
                return FinishReason.STOP
        if len(live.tokens) >= p.max_tokens:
            return FinishReason.LENGTH
        if len(live.request.prompt) + len(live.tokens) >= self.max_len:
            return FinishReason.CONTEXT
        if time.monotonic() > live.deadline:
            return FinishReason.TIMEOUT
        return None

    def _retire(self, live: _Live, reason: FinishReason) -> None:
        slot = live.slot
        if slot is not None and self._live.get(slot.index) is live:
            del self._live[slot.index]
            self._row_pos[slot.index] = self.max_len
            self._slots.release(slot)
        if not live.cancelled:
            self._resolve(live, reason)

    def _reap(self) -> None:
        now = time.monotonic()
        for live in list(self._live.values()):
            if live.cancelled:
                self._retire(live, FinishReason.CANCELLED)
            elif now > live.deadline:
                self._retire(live, FinishReason.TIMEOUT)

    def _apply_publish(self, state: nnx.State, version: int) -> None:
        self._state, self._version = (state, self._state[1]), version
        self.stats.publishes += 1
        if self.cfg.in_flight_policy != "recompute":
            return
        # Recompute every in-flight sequence's cache with the new weights before it continues.
        for live in self._live.values():
            slot = live.slot
            seq = [*live.request.prompt, *live.tokens[:-1]]
            self._prefill_row(slot, seq, 0, keep=False)
            self._row_pos[slot.index] = len(slot.cached)

    def _resolve(self, live: _Live, reason: FinishReason) -> None:
        completion = Completion(
            tokens=tuple(live.tokens),
            logprobs=tuple(live.logprobs),
            raw_logprobs=tuple(live.raw),
            versions=tuple(live.versions),
            finish_reason=reason,
            prompt_tokens=len(live.request.prompt),
            cached_tokens=live.cached_tokens,
        )
        self.stats.completed += 1
        self.stats.generated_tokens += len(live.tokens)

        def deliver() -> None:
            if not live.future.done():
                live.future.set_result(completion)

        _call_soon(live.loop, deliver)

    def _fail_all(self, error: BaseException) -> None:
        with self._cv:
            self._closed = True
            pending = [*self._waiting, *self._live.values()]
            self._waiting.clear()
            self._live.clear()
        for live in pending:
            exc = (
                error
                if isinstance(error, EngineClosed)
                else EngineClosed(f"engine failed: {error!r}")
            )

            def fail(live: _Live = live, exc: BaseException = exc) -> None:
                if not live.future.done():
                    live.future.set_exception(exc)

            _call_soon(live.loop, fail)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    # A closed caller loop means nobody is waiting for the result any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn)
