"""Complete groups per minute under tool latency, and the event loop's CPU per episode.

Each episode is three model turns (two tool calls, then the answer); the tool's latency is
lognormal (p50 50 ms, p99 1 s), and in the second workload also has 1% stragglers of 5 s. The
"model" is a batched engine stand-in: `--slots` requests decode at once, each taking `--model-ms`.
Three ways of running the same workload, in one process:
  sequential  one episode at a time;
  sync batch  `--concurrency` episodes in lockstep: every turn waits for the slowest tool call;
  orchestrator up to `--concurrency` episodes, each group released as soon as its 8 members end
              (a consumer takes released groups off the queue, as the learner would).
Rates are measured in steady state (groups completed in a window after a warm-up). The bound is
min(engine capacity, concurrency / mean episode time).

Event-loop CPU per episode (µs/ep) is `time.thread_time()` read on the event loop's own thread
(asyncio.run runs it on the main thread) at the start and end of the window, divided by the
episodes that ended in the window. It counts everything that runs on the loop: orchestrator,
episodes, agents, tool executor, the calculator tool, the engine and latency stand-ins, asyncio
itself and the garbage collector; it excludes other threads (sync tools' pool; none here) and the
time the process waits for a CPU, so it stays meaningful on a loaded machine, though cache
contention from other processes still inflates it.

The garbage collector is set as a training process sets it after start-up
(`rollout/gc_tuning.tune_for_rollout`: heap frozen, generation-0 threshold raised); `--default-gc`
keeps CPython's defaults instead. Each mode runs on the loop the train stage runs episodes on
(`rollout/event_loop.py`: uvloop); `--asyncio-loop` uses asyncio's own loop instead.

Targets (issue 15), on both workloads in one run: the orchestrator ≥ 90% of the bound and ≥ 3× the
synchronous batch, with ≤ 1.5 ms of event-loop CPU per episode ("targets" column).

    .venv/bin/python benchmarks/straggler.py --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass

from asyncrl.agents import ToolAgent
from asyncrl.envs.latency import DelayedTool, LatencySpec
from asyncrl.envs.tasks import task_stream
from asyncrl.envs.tool_env import ToolEnvironment
from asyncrl.rollout import event_loop
from asyncrl.rollout.episode import Episode, EpisodeLimits, EpisodeSpec
from asyncrl.rollout.gc_tuning import tune_for_rollout
from asyncrl.rollout.groups import GroupQueue
from asyncrl.rollout.orchestrator import (
    Orchestrator,
    OrchestratorSettings,
    member_seed,
    numbered,
)
from asyncrl.sampling.stats import EngineStats
from asyncrl.tokenize import ByteTokenizer, ChatFormat
from asyncrl.tools.calculator import calculator
from asyncrl.tools.executor import ToolExecutor
from asyncrl.tools.function import FunctionTool
from asyncrl.types import Completion, FinishReason, GenerateRequest, SamplingParams, ToolCall

G = 8
TOK = ByteTokenizer()
FMT = ChatFormat("chatml", TOK)
CALL = (*FMT.tool_call_tokens(ToolCall(name="calculator", arguments_json='{"expression": "2+2"}')),
        FMT.end_of_turn)  # fmt: skip
ANSWER = (*TOK.encode("4"), FMT.end_of_turn)
TOOL_TURNS = 2


class SlotEngine:
    """A batched engine stand-in: `slots` requests at once, each `model_s` long."""

    def __init__(self, slots: int, model_s: float) -> None:
        self._slots = asyncio.Semaphore(slots)
        self.model_s = model_s
        self.version = 0
        self.stats = EngineStats()
        self.exhausted = False
        self.slots_in_use = 0
        self._turns: dict[str, int] = {}

    def warmup(self) -> None:
        return None

    def close(self) -> None:
        self.exhausted = True

    def publish(self, params: object, version: int) -> None:
        self.version = version

    async def generate(self, request: GenerateRequest) -> Completion:
        async with self._slots:
            self.slots_in_use += 1
            try:
                await asyncio.sleep(self.model_s)
            finally:
                self.slots_in_use -= 1
        turn = self._turns.get(request.session, 0)
        self._turns[request.session] = turn + 1
        tokens = CALL if turn < TOOL_TURNS else ANSWER
        n = len(tokens)
        return Completion(
            tokens=tokens,
            logprobs=(0.0,) * n,
            raw_logprobs=(0.0,) * n,
            versions=(0,) * n,
            finish_reason=FinishReason.STOP,
        )


class Lockstep:
    """A barrier whose party count shrinks as episodes finish (a synchronous batch's turns)."""

    def __init__(self, parties: int) -> None:
        self.parties, self.arrived = parties, 0
        self.release = asyncio.Event()

    async def wait(self) -> None:
        self.arrived += 1
        event = self.release
        self._maybe_release()
        await event.wait()

    def leave(self) -> None:
        self.parties -= 1
        self._maybe_release()

    def _maybe_release(self) -> None:
        if self.parties and self.arrived >= self.parties:
            self.arrived = 0
            self.release.set()
            self.release = asyncio.Event()


class LockstepEnv(ToolEnvironment):
    def __init__(self, make_executor, lockstep: Lockstep) -> None:
        super().__init__(make_executor)
        self.lockstep = lockstep

    async def step(self, action):
        result = await super().step(action)
        if not result.done:
            await self.lockstep.wait()
        return result

    async def close(self) -> None:
        self.lockstep.leave()


@dataclass
class Workload:
    spec: LatencySpec
    rng: random.Random

    def executor(self, task) -> ToolExecutor:
        tool = DelayedTool(FunctionTool(calculator), self.spec, self.rng)
        return ToolExecutor([tool], timeout_s=60, output_chars=100)


SAMPLING = SamplingParams(max_tokens=128, stop_tokens=(FMT.end_of_turn,))
LIMITS = EpisodeLimits(max_steps=4, max_response_tokens=512, max_context=1024, timeout_s=120)


def _spec(task, group_id: str, member: int) -> EpisodeSpec:
    from dataclasses import replace

    return EpisodeSpec(
        episode_id=f"{group_id}/{member}",
        group_id=group_id,
        task=task,
        sampling=replace(SAMPLING, seed=member_seed(0, group_id, member, 0)),
    )


@dataclass(frozen=True, slots=True)
class Rate:
    groups_per_min: float
    cpu_us_per_episode: float  # event-loop thread CPU over the window / episodes ended in it


class Window:
    """Wall time and event-loop thread CPU (`time.thread_time`, read on the loop's own thread)."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.monotonic(), time.thread_time()

    def rate(self, groups: int, episodes: int) -> Rate:
        wall, cpu = time.monotonic() - self.wall, time.thread_time() - self.cpu
        return Rate(groups / wall * 60, cpu / max(episodes, 1) * 1e6)


async def sequential(engine, work: Workload, seconds: float) -> Rate:
    done, tasks = 0, task_stream(("calculator",), "train", 10**6)
    window = Window()
    while time.monotonic() - window.wall < seconds:
        task = next(tasks)
        for m in range(G):
            env = ToolEnvironment(work.executor)
            await Episode(_spec(task, task.id, m), engine, ToolAgent(FMT), env, LIMITS).run()
        done += 1
    return window.rate(done, done * G)


async def sync_batch(engine, work: Workload, seconds: float, concurrency: int) -> Rate:
    done, tasks = 0, task_stream(("calculator",), "train", 10**6)
    window = Window()
    while time.monotonic() - window.wall < seconds:
        batch = [next(tasks) for _ in range(concurrency // G)]
        lock = Lockstep(concurrency)
        runs = [Episode(_spec(t, t.id, m), engine, ToolAgent(FMT),
                        LockstepEnv(work.executor, lock), LIMITS).run()
                for t in batch for m in range(G)]  # fmt: skip
        await asyncio.gather(*runs)
        done += len(batch)
    return window.rate(done, done * G)


async def orchestrated(
    engine, work: Workload, seconds: float, concurrency: int, warmup: float
) -> Rate:
    queue = GroupQueue(group_size=G, max_ready=10**6)
    settings = OrchestratorSettings(
        group_size=G, max_concurrency=concurrency, limits=LIMITS, sampling=SAMPLING
    )
    orch = Orchestrator(
        engine,
        queue,
        settings,
        make_env=lambda t: ToolEnvironment(work.executor),
        make_agent=lambda: ToolAgent(FMT),
    )
    runner = asyncio.create_task(orch.run(numbered(task_stream(("calculator",), "train", 10**6))))
    learner = asyncio.create_task(_consume(queue))
    await asyncio.sleep(warmup)
    released, ended = queue.stats().released, orch.status_counts.total()
    window = Window()
    await asyncio.sleep(seconds)
    rate = window.rate(queue.stats().released - released, orch.status_counts.total() - ended)
    if runner.done():  # it never ends by itself: it failed
        runner.result()
    await orch.cancel()
    runner.cancel()
    learner.cancel()
    await asyncio.gather(runner, learner, return_exceptions=True)
    return rate


async def _consume(queue: GroupQueue) -> None:
    """Takes released groups as a learner would (the queue would otherwise hold every one)."""
    while True:
        await queue.get()


def bound(spec: LatencySpec, args) -> float:
    model_s = args.model_ms / 1000
    episode_s = (TOOL_TURNS + 1) * model_s + TOOL_TURNS * spec.mean_s()
    by_concurrency = args.concurrency / episode_s / G * 60
    by_engine = args.slots / model_s / (TOOL_TURNS + 1) / G * 60
    return min(by_concurrency, by_engine)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--model-ms", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--default-gc", action="store_true", help="CPython's GC settings")
    parser.add_argument("--asyncio-loop", action="store_true", help="asyncio's loop, not uvloop")
    args = parser.parse_args()
    if not args.default_gc:
        tune_for_rollout()
    workloads = {
        "lognormal": LatencySpec(kind="lognormal", p50_s=0.05, p99_s=1.0),
        "5s stragglers": LatencySpec(
            kind="heavy_tail", p50_s=0.05, p99_s=1.0, straggler_prob=0.01, straggler_s=5.0
        ),
    }
    rows = []
    modes = ("sequential", "sync", "orchestrator")
    print(f"complete groups / min and event-loop CPU µs / episode, G={G}")
    print(
        f"{'workload':14} "
        + " ".join(f"{m:>12} {'µs/ep':>6}" for m in modes)
        + f" {'bound':>8} {'× sync':>7} {'% bound':>8}  targets"
    )
    for name, spec in workloads.items():
        rates: dict[str, Rate] = {}
        for mode in modes:
            engine = SlotEngine(args.slots, args.model_ms / 1000)
            work = Workload(spec, random.Random(0))
            if mode == "sequential":
                coro = sequential(engine, work, args.seconds / 2)
            elif mode == "sync":
                coro = sync_batch(engine, work, args.seconds, args.concurrency)
            else:
                coro = orchestrated(engine, work, args.seconds, args.concurrency, warmup=3.0)
            rates[mode] = asyncio.run(coro) if args.asyncio_loop else event_loop.run(coro)
        b = bound(spec, args)
        orch = rates["orchestrator"]
        speedup = orch.groups_per_min / rates["sync"].groups_per_min
        share = orch.groups_per_min / b
        met = share >= 0.9 and speedup >= 3 and orch.cpu_us_per_episode <= 1500
        rows.append({"workload": name, **{m: asdict(r) for m, r in rates.items()}, "bound": b})
        print(
            f"{name:14} "
            + " ".join(
                f"{r.groups_per_min:>12.1f} {r.cpu_us_per_episode:>6.0f}" for r in rates.values()
            )
            + f" {b:>8.1f} {speedup:>7.1f} {100 * share:>7.0f}%  {'met' if met else 'MISSED'}",
            flush=True,
        )
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
