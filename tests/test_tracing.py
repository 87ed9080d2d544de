"""Perfetto traces: a real run's trace is valid and complete; truncation; no-op mode; threads."""

import asyncio
import base64
import json
import threading
from pathlib import Path

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from asyncrl import tracing
from asyncrl.envs.registry import build_environment
from asyncrl.rollout.episode import Episode, EpisodeLimits, EpisodeSpec
from asyncrl.testing.configs import micro_config
from asyncrl.testing.scripted_engine import ScriptedEngine
from asyncrl.tokenize import ByteTokenizer, ChatFormat
from asyncrl.tracing.reader import index, read_packets, summarize, validate
from asyncrl.tracing.writer import COUNTERS
from asyncrl.types import FinishReason, SamplingParams, Task, ToolCall

# (A random micro model never ends a turn, so tool calls and environment steps are checked on
# a scripted episode below.)
REQUIRED_SLICES = {
    "episode",
    "turn",
    "model call",
    "environment reset",
    "prefill",
    "decode",
    "swap weights",
    "train step",
    "publish",
    "checkpoint save",
    "checkpoint finalize",
    "held-out evaluation",
}


def _train(tmp_path, *extra):
    from asyncrl.stages.train import train

    cfg = micro_config(
        "learner.steps=3",
        "learner.eval_every=0",
        "env.heldout_size=2",
        "env.train_size=8",
        "checkpoint.every_steps=2",
        "tracing.chunk_events=64",
        *extra,
    )
    from asyncrl.run_layout import RunLayout
    from asyncrl.stages.provision import claim

    return train(cfg, claim(RunLayout.of(tmp_path), cfg))


def test_a_real_training_run_writes_a_valid_complete_trace(tmp_path):
    _train(tmp_path)
    packets, truncated = read_packets(tmp_path / "train" / "trace.perfetto-trace")
    assert not truncated
    assert validate(packets) == []
    ix = index(packets)
    names = {name for _, name, *_ in ix.slices}
    assert names >= REQUIRED_SLICES, REQUIRED_SLICES - names
    assert set(COUNTERS) | {"policy lag"} <= set(ix.counter_values)
    instants = {name for _, name, _ in ix.instants}
    assert "group complete" in instants
    # Flows: each train step ends the flows of the groups it consumed, and each complete
    # group ends its members' episode flows.
    steps = [p.track_event for p in packets if p.track_event.name == "train step"]
    ends = [p.track_event for p in packets if p.track_event.type == pb.TrackEvent.TYPE_SLICE_END]
    step_ends = [e for e in ends if len(e.terminating_flow_ids) == 2]  # batch 8 = 2 groups of 4
    assert len(steps) == 3 and len(step_ends) == 3
    groups = [p.track_event for p in packets if p.track_event.name == "group complete"]
    assert groups and all(len(g.terminating_flow_ids) == 4 for g in groups)
    # Episodes share lanes, named by their id in the slice arguments.
    episodes = [s for s in ix.slices if s[1] == "episode"]
    lanes = {s[0] for s in episodes}
    assert len(lanes) < len(episodes) and all("episode" in s[4] for s in episodes)
    assert all(ix.names[lane].startswith("episode lane") for lane in lanes)
    summary = summarize(packets)
    assert 0 <= summary.engine_idle < 1 and 0 <= summary.learner_idle < 1
    assert summary.slowest_episodes and summary.by_name
    # The same run's TensorBoard scalars equal its JSONL metrics.
    from asyncrl.metrics.tracker import read_jsonl

    rows = read_jsonl(tmp_path / "train" / "metrics.jsonl", kind="train")
    scalars = _tensorboard_scalars(tmp_path / "train" / "tensorboard")
    assert [v for _, v in scalars["train/reward"]] == [
        pytest.approx(r["reward"], rel=1e-6) for r in rows
    ]
    assert {"train/groups_per_min", "train/memory_peak_bytes", "eval/solve_rate"} <= set(scalars)
    # Plots and the report that links them with the trace.
    for png in ("learning_curve", "reward_curve", "policy_lag", "queue_occupancy"):
        assert (tmp_path / "train" / f"{png}.png").stat().st_size > 1000
    from asyncrl.run_layout import RunLayout
    from asyncrl.stages.report import write_report

    paths = write_report(RunLayout.of(tmp_path))
    text = Path(paths.markdown).read_text()
    assert "train/trace.perfetto-trace" in text and "train/learning_curve.png" in text
    assert "Recovery test" in text and "did not run" in text
    page = Path(paths.html).read_text()  # self-contained: the plot's own bytes, no relative link
    png = base64.b64encode((tmp_path / "train" / "reward_curve.png").read_bytes()).decode()
    assert f"<img src='data:image/png;base64,{png}'" in page and "src='train/" not in page


def _tensorboard_scalars(logdir):
    """{tag: [(step, value)]} parsed from TFRecord event files with tensorboardX's protos."""
    import struct

    from tensorboardX.proto import event_pb2

    out = {}
    for path in sorted(logdir.glob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (length,) = struct.unpack("<Q", data[i : i + 8])
            event = event_pb2.Event.FromString(data[i + 12 : i + 12 + length])
            i += 12 + length + 4
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


def test_tool_calls_are_slices_inside_turns(tmp_path):
    tok = ByteTokenizer()
    fmt = ChatFormat("chatml", tok)
    call = ToolCall(name="calculator", arguments_json=json.dumps({"expression": "2*3"}))
    replies = iter(
        [
            ([*fmt.tool_call_tokens(call), fmt.end_of_turn], FinishReason.STOP),
            ([*tok.encode("6"), fmt.end_of_turn], FinishReason.STOP),
        ]
    )
    engine = ScriptedEngine(lambda _: next(replies))
    task = Task(id="t/0", family="calculator", prompt="2*3=?", answer="6")
    spec = EpisodeSpec(
        episode_id="e0",
        group_id="g0",
        task=task,
        sampling=SamplingParams(max_tokens=64, stop_tokens=(fmt.end_of_turn,), seed=1),
    )
    from asyncrl.agents import ToolAgent
    from asyncrl.config import EnvConfig

    path = tmp_path / "t.perfetto-trace"
    with tracing.tracing(tracing.PerfettoTracer(path)):
        episode = Episode(
            spec, engine, ToolAgent(fmt), build_environment(task, EnvConfig()), EpisodeLimits()
        )
        traj = asyncio.run(episode.run())
    assert traj.reward == 1.0
    packets, _ = read_packets(path)
    ix = index(packets)
    by_name = {name: (t0, t1, depth) for _, name, t0, t1, _, depth in ix.slices}
    assert {"tool call", "environment step", "model call", "turn"} <= set(by_name)
    tool = by_name["tool call"]
    assert tool[2] == 2  # episode > turn > tool call
    turns = [(t0, t1) for _, name, t0, t1, _, _ in ix.slices if name == "turn"]
    assert any(t0 <= tool[0] and tool[1] <= t1 for t0, t1 in turns)
    # The finished episode's flow is open until its group consumes it: the shutdown ends it.
    assert validate(packets) == []
    assert "shutdown" in {name for _, name, _ in ix.instants}


def test_a_trace_cut_mid_chunk_reads_up_to_the_last_whole_packet(tmp_path):
    path = tmp_path / "t.perfetto-trace"
    tracer = tracing.PerfettoTracer(path, chunk_events=8)
    track = tracer.track("learner")
    for i in range(50):
        tracer.begin(track, "step", {"i": i})
        tracer.counter("policy lag", i)
        tracer.end(track)
    tracer.close()
    whole, truncated = read_packets(path)
    assert not truncated and validate(whole) == []
    data = path.read_bytes()
    cut = tmp_path / "cut.perfetto-trace"
    cut.write_bytes(data[: len(data) * 2 // 3])  # the middle of some packet (or chunk)
    partial, truncated = read_packets(cut)
    assert truncated and 0 < len(partial) < len(whole)
    assert [p.SerializeToString() for p in partial] == [
        p.SerializeToString() for p in whole[: len(partial)]
    ]
    assert validate(partial, truncated=True) == []


def test_tracing_disabled_writes_no_trace(tmp_path):
    _train(tmp_path, "tracing.enabled=false", "learner.steps=1")
    assert not list(tmp_path.rglob("*.perfetto-trace"))
    assert isinstance(tracing.get(), tracing.NullTracer)  # nothing left installed


def test_concurrent_threads_keep_balanced_slices(tmp_path):
    path = tmp_path / "t.perfetto-trace"
    tracer = tracing.PerfettoTracer(path, chunk_events=32)

    def worker(n):
        lane = tracer.acquire_lane()
        for i in range(200):
            tracer.begin(lane, "outer", {"w": n})
            tracer.begin(lane, "inner")
            tracer.end(lane)
            tracer.end(lane)
            tracer.counter("active episodes", i)
        tracer.release_lane(lane)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tracer.close()
    packets, _ = read_packets(path)
    assert validate(packets) == []
    ix = index(packets)
    assert sum(1 for s in ix.slices if s[1] == "outer") == 8 * 200


def test_progress_is_a_redrawn_line_on_a_tty_and_plain_lines_elsewhere():
    import io

    from asyncrl.metrics.progress import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty, plain = Tty(), io.StringIO()
    for stream in (tty, plain):
        p = Progress(10, "train", stream=stream, every_s=3600)
        for i in range(1, 11):
            p.update(i, {"reward": i})
        p.close()
    assert tty.getvalue().count("\r") == 10 and "10/10" in tty.getvalue()
    lines = plain.getvalue().splitlines()
    assert len(lines) == 2 and "1/10" in lines[0] and "10/10" in lines[1]  # first and last
    assert "\r" not in plain.getvalue()
