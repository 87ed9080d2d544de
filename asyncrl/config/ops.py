"""Configuration of how a run executes: checkpoints, traces, gate and pipeline (where it executes,
the cluster section, is config/cluster.py).

Owns those operational sections of `RunConfig` and what a location may be (`check_location`: a
local path, or gs://bucket/path with a bucket name GCS would accept and no '..' in the path).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Literal

from asyncrl.config.errors import ConfigError, abbreviate, require, seconds

GS = "gs://"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]*[a-z0-9]$")
_LOCATION = "a local path or gs://bucket/path"


def check_location(key: str, value: str) -> None:
    """Raise a ConfigError for `key` unless `value` is a local path or a well-formed gs:// URI."""
    problem = location_problem(value)
    if problem:
        raise ConfigError(key, f"got {abbreviate(repr(value))}: {problem}; allowed: {_LOCATION}")


def location_problem(value: str) -> str:
    """What is wrong with a location ("" when nothing): GCS bucket rules, no '..' or empty segments,
    no scheme but gs:// (so "gs:/b" or "s3://b" never becomes a local folder of that name)."""
    if not value.isprintable():
        return "control characters"
    if not value.startswith(GS):
        return "an unsupported scheme or a malformed gs:// prefix" if _SCHEME.match(value) else ""
    bucket, _, path = value[len(GS) :].partition("/")
    if not bucket:
        return "no bucket name"
    problem = bucket_problem(bucket)
    if problem:
        return f"bucket {abbreviate(repr(bucket), 40)} {problem}"
    parts = path.rstrip("/").split("/") if path.rstrip("/") else []
    if any(p in ("", ".", "..") for p in parts):
        return "an empty, '.' or '..' segment in the object path"
    return ""


def bucket_problem(name: str) -> str:
    """GCS bucket naming rules (cloud.google.com/storage/docs/buckets#naming), "" when valid."""
    if not 3 <= len(name) <= (222 if "." in name else 63):
        return "must be 3-63 characters (222 with dots)"
    if not _BUCKET.match(name):
        return "may hold only a-z, 0-9, '-', '_' and '.', and starts and ends with a-z or 0-9"
    if any(len(part) > 63 or not part for part in name.split(".")):
        return "has an empty or over-63-character dot-separated part"
    try:
        ipaddress.IPv4Address(name)
        return "must not be an IP address"
    except ValueError:
        pass
    if name.startswith("goog") or "google" in name or "g00gle" in name:
        return "must not start with 'goog' or contain 'google'"
    return ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointConfig:
    # Where checkpoints go: a local path or gs://bucket/prefix ("" = <run dir>/checkpoints).
    dir: str = ""
    # Save every this many optimizer steps (0 = only at the end).
    every_steps: int = 10
    # Complete checkpoints kept; older ones are deleted after a newer one is finalized.
    max_to_keep: int = 3
    # Write in the background while training continues.
    async_save: bool = True

    def __post_init__(self) -> None:
        require(self.every_steps >= 0, "every_steps", self.every_steps, "an integer >= 0")
        require(self.max_to_keep >= 1, "max_to_keep", self.max_to_keep, "an integer >= 1")
        check_location("dir", self.dir)


@dataclass(frozen=True, slots=True, kw_only=True)
class TracingConfig:
    # Write a Perfetto trace of the run.
    enabled: bool = True
    # Events buffered before a chunk is flushed to disk (a crash loses at most one chunk).
    chunk_events: int = 2048
    # Seconds between samples of the counter tracks.
    counter_interval_s: float = field(default=0.5, metadata=seconds())
    # Also write TensorBoard event files (beside the JSONL metrics, which are always written).
    tensorboard: bool = True

    def __post_init__(self) -> None:
        require(self.chunk_events >= 1, "chunk_events", self.chunk_events, "an integer >= 1")
        require(self.counter_interval_s > 0, "counter_interval_s", self.counter_interval_s, "> 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class GateConfig:
    # The candidate's held-out solve rate (pass@1) must reach this.
    min_solve_rate: float = 0.0
    # The greedy solve rate must exceed that of the model training started from (the warm start,
    # recorded by the train stage on the same held-out tasks) by this much; 0 = no such check.
    min_gain: float = 0.0
    # Largest allowed drop against the champion, per metric, in absolute points of the rate.
    max_regression: float = 0.05
    # Samples per task for pass@k, and their temperature (greedy is always evaluated too).
    samples_per_task: int = 4
    temperature: float = 1.0
    # Confidence level of the intervals; a difference counts only beyond its interval.
    confidence: float = 0.95
    # Where the champion pointer lives (local path or gs://; "" = <runs dir>/champion).
    champion: str = ""
    # Promote a passing candidate to champion.
    promote: bool = True

    def __post_init__(self) -> None:
        require(0 <= self.min_solve_rate <= 1, "min_solve_rate", self.min_solve_rate, "in [0, 1]")
        require(0 <= self.min_gain <= 1, "min_gain", self.min_gain, "in [0, 1]")
        require(0 <= self.max_regression <= 1, "max_regression", self.max_regression, "in [0, 1]")
        require(self.samples_per_task >= 1, "samples_per_task", self.samples_per_task, ">= 1")
        require(self.temperature > 0, "temperature", self.temperature, "a number > 0")
        require(0.5 <= self.confidence < 1, "confidence", self.confidence, "a number in [0.5, 1)")
        check_location("champion", self.champion)


Stage = Literal["provision", "warm_start", "train", "recovery_test", "quality_gate", "report"]
ALL_STAGES: tuple[Stage, ...] = (
    "provision",
    "warm_start",
    "train",
    "recovery_test",
    "quality_gate",
    "report",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineConfig:
    # Pipeline name shown in Kubeflow.
    name: str = "asyncrl"
    # Where runs are written locally (runs/<run-id>/) or the gs:// root of run artifacts.
    runs_dir: str = "runs"
    # Run id; "" = a timestamped id chosen at start.
    run_id: str = ""
    # Stages to run, in pipeline order.
    stages: tuple[Stage, ...] = ALL_STAGES
    # Kubeflow Pipelines endpoint for submit/schedule ("" = given on the command line).
    kfp_host: str = ""
    # Kubeflow experiment runs are filed under.
    experiment: str = "asyncrl"
    # Seconds a local or remote run may take before it is abandoned.
    timeout_s: float = field(default=3600.0, metadata=seconds())

    def __post_init__(self) -> None:
        require(
            bool(re.match(r"^[a-z0-9][a-z0-9-]*$", self.name)),
            "name",
            self.name,
            "lowercase letters, digits and '-'",
        )
        require(bool(self.runs_dir), "runs_dir", self.runs_dir, "a non-empty path or gs:// URI")
        check_location("runs_dir", self.runs_dir)
        require(
            not self.run_id or bool(re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*$", self.run_id)),
            "run_id",
            self.run_id,
            "letters, digits, '.', '_' and '-'",
        )
        require(
            len(self.stages) > 0, "stages", self.stages, f"a non-empty subsequence of {ALL_STAGES}"
        )
        require(len(set(self.stages)) == len(self.stages), "stages", self.stages, "no repeats")
        order = [ALL_STAGES.index(s) for s in self.stages]
        require(order == sorted(order), "stages", self.stages, f"a subsequence of {ALL_STAGES}")
        require(self.timeout_s > 0, "timeout_s", self.timeout_s, "a number > 0")
