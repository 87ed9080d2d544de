"""The pipeline's run-time parameters and the one resolution of them into the run's config.

Owns which config key each typed parameter of the Kubeflow form sets, and its "unset" value (the
parameter's default, meaning "keep the config's value"): "" for text, an empty list for lists and
-1 for numbers. None of the keys they set accepts a negative number, so -1 is never a real setting.
Resolution goes through the CLI's loader (`load_config_text` with dotted overrides), so a pipeline
run refuses exactly what `asyncrl run` refuses, with the same `ConfigError` naming the key and the
allowed values. A key set both in `overrides` and by a typed parameter is refused rather than one
silently winning.

Provision resolves once and hands the resolved YAML to every stage; teardown, the exit handler,
cannot read provision's outputs (KFP forbids it), so it resolves the same parameters the same way.
What the compiled pipeline fixed at compile time (the image, TPU selectors, timeouts: `cluster.*`,
`pipeline.timeout_s`) is not changed by parameters at run time; compile another pipeline for that.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import yaml

from asyncrl.config import ConfigError, RunConfig, load_config_text, parse_override

KEY = "asyncrl.pipeline.key"  # field metadata: the dotted config key a typed parameter sets


def _sets(key: str) -> dict[str, str]:
    return {KEY: key}


@dataclass(frozen=True, slots=True, kw_only=True)
class RunParams:
    """A run's parameters besides the config; each default means "keep the config's value"."""

    overrides: tuple[str, ...] = ()
    model_checkpoint: str = field(default="", metadata=_sets("model.checkpoint"))
    tasks: tuple[str, ...] = field(default=(), metadata=_sets("env.tasks"))
    rl_steps: int = field(default=-1, metadata=_sets("learner.steps"))
    learning_rate: float = field(default=-1.0, metadata=_sets("learner.lr"))
    loss: str = field(default="", metadata=_sets("learner.loss"))
    min_solve_rate: float = field(default=-1.0, metadata=_sets("gate.min_solve_rate"))

    @classmethod
    def of(cls, overrides: Sequence[object] | None = None, **typed: object) -> RunParams:
        """From KFP's values (lists arrive as lists, possibly None for an optional input)."""
        items = list(overrides or ())
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise ConfigError(f"overrides[{i}]", f"got {item!r}; expected a key=value string")
        tasks = typed.pop("tasks", None) or ()
        return cls(overrides=tuple(items), tasks=tuple(str(t) for t in tasks), **typed)  # type: ignore[arg-type]

    def typed_overrides(self) -> dict[str, tuple[str, str]]:
        """Config key -> (parameter name, `key=value` override) for each typed parameter set."""
        out = {}
        for f in dataclasses.fields(self):
            key = f.metadata.get(KEY)
            value = getattr(self, f.name)
            if key is None or value == f.default:
                continue
            shown = list(value) if isinstance(value, tuple) else value
            # JSON is YAML: a text value stays text, whatever characters it holds.
            out[key] = (f.name, f"{key}={json.dumps(shown)}")
        return out


def config_default(cfg: RunConfig) -> str:
    """`cfg` as the default of `config_yaml`: one line of flow-style YAML, which the loader reads
    back to an equal config. One line because kfp (2.17) copies each pipeline default into the
    compiled file's header comment without escaping line breaks, and a multi-line default ends
    the comment mid-text, so the file is no longer YAML (kubeflow/pipelines#10438, unfixed)."""

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: object) -> bool:  # the loader refuses aliases
            return True

    data = cfg.to_dict()
    text = yaml.dump(data, Dumper=Dumper, default_flow_style=True, width=math.inf, sort_keys=False)
    return text.strip()


def typed_names() -> tuple[str, ...]:
    """The typed parameters' names, in the order the pipeline declares them."""
    return tuple(f.name for f in dataclasses.fields(RunParams) if KEY in f.metadata)


def resolve(config_yaml: str, params: RunParams) -> RunConfig:
    """The run's config: `config_yaml`, then `params.overrides`, then the typed parameters set."""
    typed = params.typed_overrides()
    for item in params.overrides:
        key, _ = parse_override(item)
        if key in typed:
            raise ConfigError(
                key,
                f"set twice: in overrides ({item!r}) and by the parameter '{typed[key][0]}'; "
                "set it in one place",
            )
    try:
        return load_config_text(
            config_yaml,
            [*params.overrides, *(o for _, o in typed.values())],
            source="the pipeline's config_yaml",
        )
    except ConfigError as e:
        source = next((k for k in typed if e.key == k or e.key.startswith(f"{k}[")), None)
        if source is not None:  # name the form field the value came from
            message = f"{e.message} (from the pipeline parameter '{typed[source][0]}')"
            raise ConfigError(e.key, message) from None
        raise
