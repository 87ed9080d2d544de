"""`RunConfig`: every section composed, and the constraints that span sections.

Owns cross-field validation (each error names the dotted keys involved) and the config hash that a
checkpoint records. Derived values are computed by properties, never written back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field

from asyncrl.config.cluster import ClusterConfig
from asyncrl.config.errors import require
from asyncrl.config.learner import LearnerConfig
from asyncrl.config.model import ModelConfig, TokenizerConfig
from asyncrl.config.ops import (
    CheckpointConfig,
    GateConfig,
    PipelineConfig,
    TracingConfig,
)
from asyncrl.config.rollout import EnvConfig, RolloutConfig
from asyncrl.config.warm_start import WarmStartConfig

# Ids the byte tokenizer can produce: 256 bytes plus its special tokens (tokenize/byte.py keeps it).
BYTE_TOKENIZER_VOCAB = 256 + 16


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    # Seed of parameter init, sampling keys and data order.
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)

    def __post_init__(self) -> None:
        r, lrn, m, env = self.rollout, self.learner, self.model, self.env
        require(
            r.max_tokens <= lrn.max_response_length,
            "rollout.max_tokens",
            r.max_tokens,
            f"at most learner.max_response_length={lrn.max_response_length}",
        )
        require(
            env.max_response_tokens <= lrn.max_response_length,
            "env.max_response_tokens",
            env.max_response_tokens,
            f"at most learner.max_response_length={lrn.max_response_length}",
        )
        require(
            r.group_size >= 2,
            "rollout.group_size",
            r.group_size,
            f"at least 2: learner.loss={lrn.loss!r} uses group-relative advantages",
        )
        require(
            lrn.batch_size % r.group_size == 0,
            "learner.batch_size",
            lrn.batch_size,
            f"a multiple of rollout.group_size={r.group_size}",
        )
        require(
            r.return_logprobs,
            "rollout.return_logprobs",
            r.return_logprobs,
            f"true: learner.loss={lrn.loss!r} with off_policy_correction="
            f"{lrn.off_policy_correction!r} uses the rollout policy's log-probabilities",
        )
        require(
            env.max_context <= m.max_seq_len,
            "env.max_context",
            env.max_context,
            f"at most model.max_seq_len={m.max_seq_len}",
        )
        require(
            r.prefill_buckets[-1] <= env.max_context,
            "rollout.prefill_buckets",
            r.prefill_buckets,
            f"buckets no longer than env.max_context={env.max_context}",
        )
        require(
            r.attention_windows[-1] >= env.max_context,
            "rollout.attention_windows",
            r.attention_windows,
            f"a largest window >= env.max_context={env.max_context}",
        )
        require(
            self.tokenizer.kind != "byte" or m.vocab_size >= BYTE_TOKENIZER_VOCAB,
            "model.vocab_size",
            m.vocab_size,
            f">= {BYTE_TOKENIZER_VOCAB} (the byte tokenizer's ids)",
        )
        require(
            lrn.mode == "async" or lrn.max_staleness == 0,
            "learner.max_staleness",
            lrn.max_staleness,
            "0 when learner.mode is 'sync' (a barrier never trains on stale data)",
        )
        require(
            r.top_k <= m.vocab_size,
            "rollout.top_k",
            r.top_k,
            f"at most model.vocab_size={m.vocab_size} (0 = off)",
        )
        require(
            not (self.cluster.backend == "local" and self.pipeline.runs_dir.startswith("gs://")),
            "pipeline.runs_dir",
            self.pipeline.runs_dir,
            "a local path when cluster.backend is 'local' (gs:// run folders live on the "
            "cluster's bucket mount: use cluster.backend=gke)",
        )
        timeout = self.cluster.jobset_timeout_s
        require(
            timeout is None or timeout < self.pipeline.timeout_s,
            "cluster.jobset_timeout_s",
            timeout,
            f"less than pipeline.timeout_s={self.pipeline.timeout_s:g} (the train task's own "
            "limit: the launcher must delete the JobSet before the task is killed), or null",
        )
        require(
            r.max_concurrency >= r.group_size,
            "rollout.max_concurrency",
            r.max_concurrency,
            f"at least rollout.group_size={r.group_size} (a group runs together)",
        )

    def to_dict(self) -> dict[str, object]:
        """Plain data (lists for tuples), the inverse of `loader.from_dict`."""
        return _plain(dataclasses.asdict(self))

    def hash(self) -> str:
        """A stable digest of what decides the run's results (the pipeline section excluded)."""
        data = self.to_dict()
        data.pop("pipeline")
        blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _plain(value: object) -> object:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
