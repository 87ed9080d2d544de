"""The run folder: `runs/<run-id>/` with the resolved config every stage reads.

Owns run ids and the layout of a run's local folder. Stages receive the folder, never invent it.
"""

from __future__ import annotations

import datetime as dt
import secrets
from pathlib import Path

from asyncrl.config import RunConfig, to_yaml

CONFIG_FILE = "config.yaml"


def new_run_id() -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(3)}"


def create_run_dir(cfg: RunConfig) -> Path:
    """Make runs/<run-id>/ (the configured id, or a fresh one) and write the resolved config."""
    run_id = cfg.pipeline.run_id or new_run_id()
    path = Path(cfg.pipeline.runs_dir) / run_id
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).write_text(to_yaml(cfg))
    return path
