"""Run configuration: frozen dataclasses per component, YAML presets and dotted overrides.

Imports no JAX. `load_config(path, overrides)` is the one entry point; every error is a
`ConfigError` naming the dotted key, the value and what is allowed.
"""

from asyncrl.config.cluster import ClusterConfig
from asyncrl.config.errors import ConfigError
from asyncrl.config.learner import LearnerConfig
from asyncrl.config.loader import from_dict, load_config, load_config_text, parse_override, to_yaml
from asyncrl.config.model import ModelConfig, TokenizerConfig
from asyncrl.config.ops import (
    CheckpointConfig,
    GateConfig,
    PipelineConfig,
    TracingConfig,
)
from asyncrl.config.presets import MODEL_PRESETS
from asyncrl.config.rollout import EnvConfig, RolloutConfig
from asyncrl.config.run import RunConfig
from asyncrl.config.warm_start import WarmStartConfig

__all__ = [
    "MODEL_PRESETS",
    "CheckpointConfig",
    "ClusterConfig",
    "ConfigError",
    "EnvConfig",
    "GateConfig",
    "LearnerConfig",
    "ModelConfig",
    "PipelineConfig",
    "RolloutConfig",
    "RunConfig",
    "TokenizerConfig",
    "TracingConfig",
    "WarmStartConfig",
    "from_dict",
    "load_config",
    "load_config_text",
    "parse_override",
    "to_yaml",
]
