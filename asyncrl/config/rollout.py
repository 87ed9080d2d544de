"""Configuration of generation (the engine and its sampling) and of the agent environments.

Owns what an episode may do: how many run at once, how tokens are sampled, and the limits on turns,
tokens and time. It does not know about training; cross-checks with the learner live in `run.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from asyncrl.config.errors import bounds, require, seconds

InFlightPolicy = Literal["continue", "recompute"]
AgentKind = Literal["model", "tool"]
MalformedToolCall = Literal["observation", "terminate"]
TaskFamily = Literal["calculator", "lookup"]
FailurePolicy = Literal["drop", "zero", "retry"]
MAX_TOOL_WORKERS = 256  # sync tool threads (each may be replaced once: at most twice as many live)


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutConfig:
    # Trajectories per task (G); a group is the unit of GRPO advantages.
    group_size: int = 8
    # Episodes active at once in the orchestrator.
    max_concurrency: int = 32
    # Decode slots of the continuous-batching engine (requests decoded together).
    engine_slots: int = 32
    # Bound on requests waiting for a slot; a full queue applies backpressure to episodes.
    engine_queue: int = 256
    # Prompt length buckets for prefill; a prompt is padded up to the next bucket.
    prefill_buckets: tuple[int, ...] = (32, 128, 512)
    # Attention windows (static sizes) chosen by the longest active sequence.
    attention_windows: tuple[int, ...] = (128, 256, 512, 1024)
    # New tokens per model call (one assistant turn).
    max_tokens: int = 128
    # Sampling temperature; 0 means greedy.
    temperature: float = 1.0
    # Nucleus sampling mass (1.0 = off).
    top_p: float = 1.0
    # Keep only the k most likely tokens (0 = off).
    top_k: int = 0
    # Drop tokens below min_p times the top probability (0 = off).
    min_p: float = 0.0
    # Penalty on tokens already in the sequence (1.0 = off).
    repetition_penalty: float = 1.0
    # Return per-token log-probabilities of sampled tokens (the learner's behaviour policy).
    return_logprobs: bool = True
    # On a weight publish: finish in-flight requests on the old KV cache, or re-prefill them.
    in_flight_policy: InFlightPolicy = "continue"
    # Seconds one engine request may take before it fails with a timeout.
    request_timeout_s: float = field(default=120.0, metadata=seconds())
    # A group member that failed (timeout, tool_error, env_error, cancelled): drop its group, keep
    # it scored 0, or re-run it up to `max_retries` times (then drop the group).
    failure_policy: FailurePolicy = "zero"
    max_retries: int = 2
    # When a member's failure dooms its group (drop, or retry with retries spent), cancel the
    # group's other running members at once instead of generating for a group that is discarded.
    cancel_doomed_groups: bool = True
    # Complete groups waiting for the learner before the orchestrator stops starting new ones.
    max_ready_groups: int = 16

    def __post_init__(self) -> None:
        require(self.max_retries >= 0, "max_retries", self.max_retries, "an integer >= 0")
        for name in (
            "group_size",
            "max_concurrency",
            "engine_slots",
            "engine_queue",
            "max_tokens",
            "max_ready_groups",
        ):
            value = getattr(self, name)
            require(value > 0, name, value, "a positive integer")
        require(self.temperature >= 0, "temperature", self.temperature, "a number >= 0")
        require(0 < self.top_p <= 1, "top_p", self.top_p, "a number in (0, 1]")
        require(self.top_k >= 0, "top_k", self.top_k, "an integer >= 0 (0 = off)")
        require(0 <= self.min_p < 1, "min_p", self.min_p, "a number in [0, 1)")
        require(
            self.repetition_penalty > 0,
            "repetition_penalty",
            self.repetition_penalty,
            "a number > 0 (1.0 = off)",
        )
        require(self.request_timeout_s > 0, "request_timeout_s", self.request_timeout_s, "> 0")
        for name in ("prefill_buckets", "attention_windows"):
            sizes = getattr(self, name)
            require(
                len(sizes) > 0 and all(s > 0 for s in sizes) and list(sizes) == sorted(set(sizes)),
                name,
                sizes,
                "a non-empty, strictly increasing list of positive integers",
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvConfig:
    # Task families sampled for training and evaluation (several environments in one run).
    tasks: tuple[TaskFamily, ...] = ("calculator", "lookup")
    # "tool": multi-turn tool calls; "model": the first response is the answer.
    agent: AgentKind = "tool"
    # Model turns per episode before it ends as truncated_steps.
    max_steps: int = 4
    # Model-sampled tokens per episode, over all turns, before it ends as truncated_tokens.
    max_response_tokens: int = 256
    # Whole sequence (prompt, turns, tool output) in tokens; must fit the model.
    max_context: int = 1024
    # Wall-clock seconds for one episode before it ends as timeout.
    episode_timeout_s: float = field(default=60.0, metadata=seconds())
    # Seconds one tool call may run before it is cancelled.
    tool_timeout_s: float = field(default=5.0, metadata=seconds())
    # Characters of tool output kept; the rest is cut and the result marked output_truncated.
    # A tool's error text is cut to the same length.
    tool_output_chars: int = 2000
    # Threads that run sync tools, a pool of their own (never asyncio's default executor): at most
    # this many sync calls at once; a hung call's thread is abandoned and replaced (up to as many
    # again), so hung tools do not starve healthy ones.
    tool_workers: int = field(default=8, metadata=bounds(1, MAX_TOOL_WORKERS, "threads"))
    # A malformed tool call becomes an observation the model sees, or ends the episode.
    malformed_tool_call: MalformedToolCall = "observation"
    # Training tasks generated per family per epoch, and the fixed held-out split size.
    train_size: int = 2048
    heldout_size: int = 64
    # Seed of the deterministic task generators.
    seed: int = 0
    # Injected environment latency (benchmarks, soak tests): lognormal per reset and step with
    # this median and 99th percentile in seconds (0 = none).
    latency_p50_s: float = field(default=0.0, metadata=seconds())
    latency_p99_s: float = field(default=0.0, metadata=seconds())

    def __post_init__(self) -> None:
        require(
            self.latency_p50_s >= 0
            and (self.latency_p50_s == 0 or self.latency_p99_s >= self.latency_p50_s),
            "latency_p99_s",
            self.latency_p99_s,
            f"a number >= latency_p50_s={self.latency_p50_s}",
        )
        require(len(self.tasks) > 0, "tasks", self.tasks, "a non-empty list of task families")
        require(len(set(self.tasks)) == len(self.tasks), "tasks", self.tasks, "no repeated family")
        for name in (
            "max_steps",
            "max_response_tokens",
            "max_context",
            "train_size",
            "heldout_size",
        ):
            value = getattr(self, name)
            require(value > 0, name, value, "a positive integer")
        require(self.episode_timeout_s > 0, "episode_timeout_s", self.episode_timeout_s, "> 0")
        require(self.tool_timeout_s > 0, "tool_timeout_s", self.tool_timeout_s, "> 0")
        require(self.tool_output_chars > 0, "tool_output_chars", self.tool_output_chars, "> 0")
        require(
            1 <= self.tool_workers <= MAX_TOOL_WORKERS,
            "tool_workers",
            self.tool_workers,
            f"an integer in [1, {MAX_TOOL_WORKERS}]",
        )
