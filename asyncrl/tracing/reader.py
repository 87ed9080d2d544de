"""Reading, validating and summarizing our Perfetto traces, with the `perfetto` protobuf classes.

`read_packets` parses the file packet by packet and stops at the last whole one, so a trace cut
mid-chunk by a crash reads up to there; anything else that is not a packet (garbage, a garbage tail,
an empty file) raises `TraceError` naming the byte offset, never a protobuf or index error.
`validate` checks what the Perfetto UI relies on: every event's track was described, timestamps
never go back on the sequence, slices begin and end in balance per track (an unbalanced tail is
allowed only when `truncated`), every flow has a source and a destination. `summarize` answers
"where did the time go": time per slice name, the idle fraction of the engine and the learner over
the traced interval, and the slowest episodes.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import DecodeError
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

_BEGIN, _END, _INSTANT, _COUNTER = (
    pb.TrackEvent.TYPE_SLICE_BEGIN,
    pb.TrackEvent.TYPE_SLICE_END,
    pb.TrackEvent.TYPE_INSTANT,
    pb.TrackEvent.TYPE_COUNTER,
)


# A packet longer than this is not one of ours (the writer's packets are a few hundred bytes).
MAX_PACKET_BYTES = 16 << 20
_PACKET_TAG = 0x0A  # Trace.packet: field 1, length-delimited


class TraceError(ValueError):
    """A file that is not a Perfetto trace, or one with bytes after its packets that are not."""


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    """(value, next offset); IndexError at the end of data, ValueError past 10 bytes."""
    shift = value = 0
    for _ in range(10):
        if i >= len(data):
            raise IndexError
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7
    raise ValueError("a length varint longer than 10 bytes")


def read_packets(path: Path) -> tuple[list[pb.TracePacket], bool]:
    """(whole packets, whether the file ended inside a packet).

    A tail that begins a packet and stops is a crash's cut (truncated); any other tail, an empty
    file and a file with no whole packet raise TraceError naming the file and the byte offset.
    """
    path = Path(path)
    if path.exists() and not path.is_file():
        raise TraceError(f"{path}: not a regular file")
    data = path.read_bytes()
    if not data:
        raise TraceError(f"{path}: empty file (no trace packets)")
    packets, i = [], 0
    while i < len(data):
        packet, i, truncated = _next_packet(path, data, i, len(packets))
        if truncated:
            if not packets:
                raise TraceError(f"{path}: no whole trace packet ({len(data)} bytes, cut short)")
            return packets, True
        packets.append(packet)
    return packets, False


def _next_packet(
    path: Path, data: bytes, i: int, n: int
) -> tuple[pb.TracePacket | None, int, bool]:
    where = f"{path}: byte {i} (after {n} whole packets)"
    if data[i] != _PACKET_TAG:
        raise TraceError(f"{where}: 0x{data[i]:02x} is not a trace packet; not a Perfetto trace")
    try:
        length, start = _read_varint(data, i + 1)
    except IndexError:
        return None, i, True
    except ValueError as e:
        raise TraceError(f"{where}: {e}; not a Perfetto trace") from None
    if length > MAX_PACKET_BYTES:
        raise TraceError(
            f"{where}: a packet of {length} bytes is implausible; not a Perfetto trace"
        )
    if start + length > len(data):
        return None, i, True
    try:
        packet = pb.TracePacket.FromString(data[start : start + length])
    except DecodeError:
        raise TraceError(f"{where}: the packet does not decode; not a Perfetto trace") from None
    return packet, start + length, False


@dataclass(slots=True)
class TraceIndex:
    names: dict[int, str] = field(default_factory=dict)  # track uuid -> name
    parents: dict[int, int] = field(default_factory=dict)
    counters: set[int] = field(default_factory=set)
    # (track, name, t0, t1, args, depth): depth 0 is a top-level slice of its track
    slices: list[tuple[int, str, int, int, dict, int]] = field(default_factory=list)
    instants: list[tuple[int, str, int]] = field(default_factory=list)
    counter_values: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    flows_out: collections.Counter = field(default_factory=collections.Counter)
    flows_in: collections.Counter = field(default_factory=collections.Counter)
    problems: list[str] = field(default_factory=list)
    open_slices: int = 0
    first_ts: int = 0
    last_ts: int = 0


def index(packets: list[pb.TracePacket]) -> TraceIndex:
    ix = TraceIndex()
    stacks: dict[int, list[tuple[str, int, dict]]] = collections.defaultdict(list)
    last = {}
    for p in packets:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            ix.names[d.uuid] = d.name or d.process.process_name
            if d.parent_uuid:
                ix.parents[d.uuid] = d.parent_uuid
            if d.HasField("counter"):
                ix.counters.add(d.uuid)
            continue
        if not p.HasField("track_event"):
            continue
        seq = p.trusted_packet_sequence_id
        if p.timestamp < last.get(seq, 0):
            ix.problems.append(f"timestamp goes back on sequence {seq} at {p.timestamp}")
        last[seq] = p.timestamp
        ix.first_ts = ix.first_ts or p.timestamp
        ix.last_ts = max(ix.last_ts, p.timestamp)
        ev = p.track_event
        if ev.track_uuid not in ix.names:
            ix.problems.append(f"event {ev.name!r} on undescribed track {ev.track_uuid}")
            continue
        ix.flows_out.update(ev.flow_ids)
        ix.flows_in.update(ev.terminating_flow_ids)
        if ev.type == _BEGIN:
            args = {a.name: _value(a) for a in ev.debug_annotations}
            stacks[ev.track_uuid].append((ev.name, p.timestamp, args))
        elif ev.type == _END:
            if not stacks[ev.track_uuid]:
                ix.problems.append(f"slice end without a begin on {ix.names[ev.track_uuid]!r}")
                continue
            name, t0, args = stacks[ev.track_uuid].pop()
            depth = len(stacks[ev.track_uuid])
            ix.slices.append((ev.track_uuid, name, t0, p.timestamp, args, depth))
        elif ev.type == _INSTANT:
            ix.instants.append((ev.track_uuid, ev.name, p.timestamp))
        elif ev.type == _COUNTER:
            if ev.track_uuid not in ix.counters:
                ix.problems.append(f"counter value on non-counter track {ev.track_uuid}")
            ix.counter_values.setdefault(ix.names[ev.track_uuid], []).append(
                (p.timestamp, ev.double_counter_value)
            )
    ix.open_slices = sum(len(s) for s in stacks.values())
    return ix


def _value(a: pb.DebugAnnotation):
    for kind in ("string_value", "int_value", "double_value", "bool_value"):
        if a.HasField(kind):
            return getattr(a, kind)
    return None


def validate(packets: list[pb.TracePacket], truncated: bool = False) -> list[str]:
    """Problems found (empty: valid). A truncated trace may end with open slices and flows."""
    ix = index(packets)
    problems = list(ix.problems)
    if ix.open_slices and not truncated:
        problems.append(f"{ix.open_slices} slices never end")
    if not truncated:
        unfinished = set(ix.flows_out) - set(ix.flows_in)
        if unfinished:
            problems.append(f"{len(unfinished)} flows have no destination")
    orphans = set(ix.flows_in) - set(ix.flows_out)
    if orphans:
        problems.append(f"{len(orphans)} flows have no source")
    return problems


@dataclass(frozen=True, slots=True)
class TraceSummary:
    seconds: float
    by_name: tuple[tuple[str, float, int], ...]  # slice name, total seconds, count
    engine_idle: float
    learner_idle: float
    slowest_episodes: tuple[tuple[str, float], ...]
    counters: tuple[str, ...]


def summarize(packets: list[pb.TracePacket], top: int = 5) -> TraceSummary:
    ix = index(packets)
    span = max(ix.last_ts - ix.first_ts, 1)
    totals: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    busy: dict[str, float] = collections.Counter()
    episodes = []
    for track, name, t0, t1, args, depth in ix.slices:
        totals[name][0] += (t1 - t0) / 1e9
        totals[name][1] += 1
        track_name = ix.names.get(track, "")
        if track_name in ("engine", "learner") and depth == 0:
            busy[track_name] += t1 - t0
        if name == "episode":
            episodes.append((str(args.get("episode", "?")), (t1 - t0) / 1e9))
    by_name = tuple(
        sorted(((n, round(s, 3), c) for n, (s, c) in totals.items()), key=lambda r: -r[1])
    )
    episodes.sort(key=lambda e: -e[1])
    return TraceSummary(
        seconds=span / 1e9,
        by_name=by_name,
        engine_idle=1 - busy["engine"] / span,
        learner_idle=1 - busy["learner"] / span,
        slowest_episodes=tuple(episodes[:top]),
        counters=tuple(sorted(ix.counter_values)),
    )


def format_summary(s: TraceSummary) -> str:
    lines = [
        f"traced {s.seconds:.1f} s; engine idle {100 * s.engine_idle:.1f}%, "
        f"learner idle {100 * s.learner_idle:.1f}%",
        "time by slice (total s, count):",
    ]
    lines += [f"  {name:<24} {secs:>10.3f} {count:>8}" for name, secs, count in s.by_name]
    lines.append("slowest episodes:")
    lines += [f"  {ep:<40} {secs:.2f} s" for ep, secs in s.slowest_episodes]
    lines.append(f"counters: {', '.join(s.counters)}")
    return "\n".join(lines)
