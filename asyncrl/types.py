"""The shared vocabulary: messages, completions, trajectories and groups.

Tokens are the source of truth. A `Completion` is what the engine sampled (tokens, their log-probs
and the policy version of each); a `Trajectory` is a whole episode's token sequence with the mask of
the tokens the model produced. Text exists only for tools and environments; nothing trained is
re-tokenized from text. Every record here is frozen and imports no JAX.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field


class Role(enum.StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """One call the model asked for; `arguments_json` is the JSON object text it produced."""

    name: str
    arguments_json: str = "{}"

    def arguments(self) -> dict[str, object]:
        value = json.loads(self.arguments_json)
        if not isinstance(value, dict):
            raise ValueError(
                f"tool call arguments must be a JSON object, got {self.arguments_json}"
            )
        return value


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One chat message; an assistant message may carry tool calls, a tool message its tool."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    name: str = ""


class FinishReason(enum.StrEnum):
    STOP = "stop"  # a stop token or stop string was produced
    LENGTH = "length"  # max new tokens reached
    CONTEXT = "context"  # the sequence filled the context window
    CANCELLED = "cancelled"  # the caller cancelled the request
    TIMEOUT = "timeout"  # the request outlived its deadline
    ERROR = "error"  # the engine failed or was closed


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """What the engine sampled for one request, token-aligned.

    `logprobs[i]` is the log-probability of `tokens[i]` under the distribution it was sampled from
    (after temperature and filtering); `raw_logprobs[i]` under the unmodified model distribution.
    `versions[i]` is the policy version of the weights that produced `tokens[i]`.
    """

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    raw_logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    finish_reason: FinishReason
    prompt_tokens: int = 0
    cached_tokens: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Task:
    """One problem. `environment` names the registered environment that runs it."""

    id: str
    family: str
    prompt: str
    answer: str
    environment: str = "tool"
    table: tuple[tuple[str, str], ...] = ()  # the lookup family's key-value store


@dataclass(frozen=True, slots=True, kw_only=True)
class NumberedTask:
    """The n-th draw of a run's task stream: group `number` of the run runs `task`.

    `replay` marks a group re-issued after a restore (same number, so the same group id and seeds).
    """

    number: int
    task: Task
    replay: bool = False

    @property
    def group_id(self) -> str:
        return f"{self.task.id}@{self.number}"


class GroupOutcome(enum.StrEnum):
    """How a group's story ended: the one vocabulary of the data cursor and the loop's counters."""

    TRAINED = "trained"  # consumed by an optimizer step
    STALE = "stale"  # complete, but too old for the staleness bound: dropped whole
    FAILED = "failed"  # a member failed and the failure policy dropped the group
    WITHDRAWN = "withdrawn"  # the run stopped before the group could finish; issued again on resume
    NO_SIGNAL = "no_signal"  # every member got the same reward: zero advantages (dynamic sampling)


class TrajectoryStatus(enum.StrEnum):
    COMPLETED = "completed"
    TRUNCATED_TOKENS = "truncated_tokens"
    TRUNCATED_STEPS = "truncated_steps"
    TIMEOUT = "timeout"
    TOOL_ERROR = "tool_error"
    ENV_ERROR = "env_error"
    INVALID_ACTION = "invalid_action"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True, kw_only=True)
class Trajectory:
    """One finished episode. All per-token tuples have the length of `tokens`.

    `loss_mask[i]` is 1 only where the model sampled `tokens[i]`; for those tokens `logprobs[i]` and
    `versions[i]` come from the engine, elsewhere they are 0 and -1.
    """

    id: str
    group_id: str
    task_id: str
    tokens: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    reward: float
    reward_parts: tuple[tuple[str, float], ...] = ()
    status: TrajectoryStatus = TrajectoryStatus.COMPLETED
    turns: int = 0
    prompt_length: int = 0
    timings: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        n = len(self.tokens)
        for name in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"Trajectory.{name} has {len(getattr(self, name))} entries, not {n}"
                )

    @property
    def sampled_versions(self) -> tuple[int, ...]:
        return tuple(v for v, m in zip(self.versions, self.loss_mask, strict=True) if m)


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """The G trajectories of one task, released together once every member is terminal."""

    group_id: str
    number: int  # the group's position in the run's task stream (NumberedTask.number)
    task_id: str
    trajectories: tuple[Trajectory, ...] = field(default_factory=tuple)

    @property
    def version_span(self) -> tuple[int, int]:
        """Oldest and newest policy version among the members' sampled tokens ((-1, -1) if none)."""
        versions = [v for t in self.trajectories for v in t.sampled_versions]
        return (min(versions), max(versions)) if versions else (-1, -1)


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How one request samples. temperature 0 is greedy; 0 / 1.0 switch a filter off."""

    max_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop_tokens: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    # PRNG seed of this request's stream; None = the engine draws a fresh one. Members of a group
    # must never share a seed (identical samples give zero advantages).
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError(f"invalid sampling parameters: {self}")
        if not 0 <= self.min_p < 1 or self.repetition_penalty <= 0:
            raise ValueError(f"invalid sampling parameters: {self}")


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateRequest:
    """Tokens in: the whole prompt (the episode's full sequence so far).

    `session` names the episode: the engine keeps its KV cache after the turn and reuses it when
    the next prompt of the same session extends the tokens it has cached.
    """

    prompt: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    session: str = ""
    timeout_s: float | None = None
