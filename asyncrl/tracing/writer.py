"""The Perfetto trace writer: one timeline of episodes, engine, learner, publisher and checkpointer.

The file is a `perfetto.protos...Trace` written packet by packet (each packet a length-delimited
field 1 of `Trace`, so any prefix of whole packets is itself a valid trace). Events are recorded
as plain tuples under a lock (a span costs two clock reads and two appends) and serialized with
the `perfetto` package's protobuf classes by a background writer thread, one chunk of
`chunk_events` at a time, flushed to the OS after each chunk: a crash loses at most the chunk
being filled.

Tracks: a process track; named tracks for the engine, learner, publisher, checkpointer and groups;
one lane track per concurrent episode slot (episodes reuse lanes; the episode id is in the slice's
arguments); counter tracks. Flows link an episode to its group and a group to the train step
that consumed it (or to the instant that dropped it); flows still open when the tracer closes end
on a "shutdown" instant, so every flow has both ends. `NullTracer` does nothing and writes nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

SEQUENCE = 1
TRACK_NAMES = ("engine", "learner", "publisher", "checkpointer", "groups", "rollout")
COUNTERS = (
    "active episodes",
    "engine slots in use",
    "ready groups",
    "half-filled groups",
    "policy lag",
    "tokens/s",
    "host memory",
)
_BEGIN, _END, _INSTANT, _COUNTER = (
    pb.TrackEvent.TYPE_SLICE_BEGIN,
    pb.TrackEvent.TYPE_SLICE_END,
    pb.TrackEvent.TYPE_INSTANT,
    pb.TrackEvent.TYPE_COUNTER,
)


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


class Tracer(Protocol):
    enabled: bool

    def begin(self, track: int, name: str, args: Mapping[str, Any] | None = None) -> None: ...

    def end(self, track: int, flows: tuple[int, ...] = (), ends: tuple[int, ...] = ()) -> None:
        """End the innermost open slice of `track`; it starts `flows` and ends `ends`."""
        ...

    def instant(
        self,
        track: int,
        name: str,
        args: Mapping[str, Any] | None = None,
        flows: tuple[int, ...] = (),
        ends: tuple[int, ...] = (),
    ) -> None: ...

    def counter(self, name: str, value: float) -> None: ...

    def track(self, name: str) -> int: ...

    def acquire_lane(self) -> int: ...

    def release_lane(self, lane: int) -> None: ...

    def close(self) -> None: ...


class NullTracer:
    """Tracing off: every call returns at once; no file is created."""

    enabled = False

    def begin(self, track, name, args=None):
        pass

    def end(self, track, flows=(), ends=()):
        pass

    def instant(self, track, name, args=None, flows=(), ends=()):
        pass

    def counter(self, name, value):
        pass

    def track(self, name):
        return 0

    def acquire_lane(self):
        return 0

    def release_lane(self, lane):
        pass

    def close(self):
        pass


class PerfettoTracer:
    enabled = True

    def __init__(self, path: Path, *, chunk_events: int = 2048, process_name: str = "asyncrl"):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.chunk_events = chunk_events
        self._file = self.path.open("wb")
        self._lock = threading.Lock()
        self._events: list[tuple] = []
        self._ids = itertools.count(1000)
        self._open_flows: set[int] = set()
        self._tracks: dict[str, int] = {}
        self._free_lanes: list[int] = []
        self._lanes = 0
        self._counters: dict[str, int] = {}
        self._ready = threading.Condition(self._lock)
        self._closed = False
        self.process = next(self._ids)
        self._descriptors: list[pb.TracePacket] = [self._process_packet(process_name)]
        self._lanes_parent = self.track("episodes")
        for name in TRACK_NAMES:
            self.track(name)
        for name in COUNTERS:
            self._counter_track(name)
        self._writer = threading.Thread(target=self._write_loop, name="trace-writer", daemon=True)
        self._writer.start()

    # -- tracks ---------------------------------------------------------------------------------

    def _process_packet(self, name: str) -> pb.TracePacket:
        packet = pb.TracePacket(trusted_packet_sequence_id=SEQUENCE)
        packet.track_descriptor.uuid = self.process
        packet.track_descriptor.process.pid = os.getpid()
        packet.track_descriptor.process.process_name = name
        return packet

    def _descriptor(self, uuid: int, name: str, parent: int, counter: bool = False) -> None:
        packet = pb.TracePacket(trusted_packet_sequence_id=SEQUENCE)
        packet.track_descriptor.uuid = uuid
        packet.track_descriptor.parent_uuid = parent
        packet.track_descriptor.name = name
        if counter:
            packet.track_descriptor.counter.SetInParent()
        with self._lock:
            self._descriptors.append(packet)

    def track(self, name: str) -> int:
        """The uuid of a named track under the process (made on first use)."""
        uuid = self._tracks.get(name)
        if uuid is None:
            uuid = self._tracks[name] = next(self._ids)
            self._descriptor(uuid, name, self.process)
        return uuid

    def _counter_track(self, name: str) -> int:
        uuid = self._counters.get(name)
        if uuid is None:
            uuid = self._counters[name] = next(self._ids)
            self._descriptor(uuid, name, self.process, counter=True)
        return uuid

    def acquire_lane(self) -> int:
        with self._lock:
            if self._free_lanes:
                return self._free_lanes.pop()
            self._lanes += 1
            n = self._lanes
        uuid = next(self._ids)
        self._descriptor(uuid, f"episode lane {n}", self._lanes_parent)
        return uuid

    def release_lane(self, lane: int) -> None:
        with self._lock:
            self._free_lanes.append(lane)

    # -- events ---------------------------------------------------------------------------------

    def begin(self, track: int, name: str, args: Mapping[str, Any] | None = None) -> None:
        self._add((_BEGIN, track, name, args, (), ()))

    def end(self, track: int, flows: tuple[int, ...] = (), ends: tuple[int, ...] = ()) -> None:
        self._add((_END, track, None, None, flows, ends))

    def instant(self, track, name, args=None, flows=(), ends=()) -> None:
        self._add((_INSTANT, track, name, args, flows, ends))

    def counter(self, name: str, value: float) -> None:
        self._add((_COUNTER, self._counter_track(name), None, float(value), (), ()))

    def _add(self, event: tuple) -> None:
        with self._lock:
            if self._closed:
                return
            self._events.append((now_ns(), *event))
            if event[4]:
                self._open_flows.update(event[4])
            if event[5]:
                self._open_flows.difference_update(event[5])
            if len(self._events) >= self.chunk_events:
                self._ready.notify()

    # -- writing --------------------------------------------------------------------------------

    def _take(self) -> tuple[list[pb.TracePacket], list[tuple]]:
        descriptors, self._descriptors = self._descriptors, []
        events, self._events = self._events, []
        return descriptors, events

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                self._ready.wait_for(
                    lambda: self._closed or len(self._events) >= self.chunk_events, timeout=1.0
                )
                descriptors, events = self._take()
                closed = self._closed
            self._write(descriptors, events)
            if closed:
                return

    def _write(self, descriptors: list[pb.TracePacket], events: list[tuple]) -> None:
        if not descriptors and not events:
            return
        out = bytearray()
        for packet in itertools.chain(descriptors, map(_packet, events)):
            data = packet.SerializeToString()
            out += b"\x0a" + _varint(len(data)) + data  # Trace.packet (field 1)
        self._file.write(out)
        self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self._open_flows:  # flows whose destination never came: end them at shutdown
                ends = tuple(sorted(self._open_flows))
                self._events.append(
                    (now_ns(), _INSTANT, self.track("rollout"), "shutdown", None, (), ends)
                )
                self._open_flows.clear()
            self._closed = True
            self._ready.notify()
        self._writer.join()
        self._file.close()


def flow_id(key: str) -> int:
    """The flow id of a named thing (an episode, a group): the same wherever it is computed."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") >> 1


def _packet(event: tuple) -> pb.TracePacket:
    ts, kind, track, name, payload, flows, ends = event
    packet = pb.TracePacket(timestamp=ts, trusted_packet_sequence_id=SEQUENCE)
    ev = packet.track_event
    ev.type = kind
    ev.track_uuid = track
    if name is not None:
        ev.name = name
    if kind == _COUNTER:
        ev.double_counter_value = payload
    elif payload:
        for key, value in payload.items():
            _annotate(ev.debug_annotations.add(), key, value)
    if flows:
        ev.flow_ids.extend(flows)
    if ends:
        ev.terminating_flow_ids.extend(ends)
    return packet


def _annotate(a: pb.DebugAnnotation, key: str, value: Any) -> None:
    a.name = key
    if isinstance(value, bool):
        a.bool_value = value
    elif isinstance(value, int):
        a.int_value = value
    elif isinstance(value, float):
        a.double_value = value
    else:
        a.string_value = str(value)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# -- the process-wide tracer ------------------------------------------------------------------

_current: Tracer = NullTracer()


def get() -> Tracer:
    return _current


def install(tracer: Tracer) -> Tracer:
    """Make `tracer` the process's tracer; returns the previous one."""
    global _current
    previous, _current = _current, tracer
    return previous


@contextlib.contextmanager
def tracing(tracer: Tracer) -> Iterator[Tracer]:
    """Install `tracer` for the block, close it after."""
    previous = install(tracer)
    try:
        yield tracer
    finally:
        install(previous)
        tracer.close()


@contextlib.contextmanager
def span(track: str, name: str, args: Mapping[str, Any] | None = None) -> Iterator[None]:
    """A slice on the named track around the block (on the current tracer)."""
    tracer = _current
    uuid = tracer.track(track)
    tracer.begin(uuid, name, args)
    try:
        yield
    finally:
        tracer.end(uuid)
