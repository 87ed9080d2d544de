"""The run folder: one typed layout of `runs/<run-id>/`, the only place its paths are spelled.

Every stage receives a `RunLayout` and asks it for paths (`layout.config`,
`layout.dir(Stage.TRAIN)`, `layout.train_model`, ...), never joins strings itself. A stage's result
is a frozen dataclass with a `STAGE` class attribute; `layout.write(result)` writes it atomically (a
temporary file in the same folder, fsync, rename), and `layout.read(cls)` returns it validated field
by field (records.py), so a cut-short or hand-edited file is refused with a message, never
half-read. `layout.done(cls)` is
"the result exists and validates": a stage that died mid-write is not done.

Where the folder lives: `pipeline.runs_dir/<run id>`; a `gs://bucket/path` runs_dir is read and
written at `/gcs/bucket/path` (the Cloud Storage FUSE volume of GKE pods), so `RunLayout.uri` keeps
the URI for the cluster while `root` is the path this process writes.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from asyncrl import records

T = TypeVar("T")
FUSE_ROOT = Path("/gcs")  # where GKE pods mount gs:// buckets (Cloud Storage FUSE CSI driver)


class Stage(enum.StrEnum):
    PROVISION = "provision"
    MODEL_CHECK = "model_check"
    WARM_START = "warm_start"
    TRAIN = "train"
    RECOVERY_TEST = "recovery_test"
    QUALITY_GATE = "quality_gate"
    PROMOTE = "promote"
    REPORT = "report"
    TEARDOWN = "teardown"


# Where each stage's result lives, relative to the run folder.
RESULT_FILES: dict[Stage, str] = {
    Stage.PROVISION: "provision.json",
    Stage.MODEL_CHECK: "model_check.json",
    Stage.WARM_START: "warm_start/warm_start.json",
    Stage.TRAIN: "train/train.json",
    Stage.RECOVERY_TEST: "recovery_test/verdict.json",
    Stage.QUALITY_GATE: "quality_gate/report.json",
    Stage.PROMOTE: "promote/promotion.json",
    Stage.REPORT: "report.json",
    Stage.TEARDOWN: "teardown.json",
}


class StageResult(Protocol):
    STAGE: ClassVar[Stage]


class LayoutError(ValueError):
    """A run folder, or a result in it, that is missing, not a folder, or malformed."""


def new_run_id() -> str:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(3)}"


def local_path(uri: str) -> Path:
    """A folder URI as a path this process can write: gs://b/p is /gcs/b/p, a path is itself."""
    if uri.startswith("gs://"):
        return FUSE_ROOT / uri[len("gs://") :]
    return Path(uri)


def write_atomic(path: Path, data: bytes) -> None:
    """Write `path` so that a reader sees the old content or the new, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True, slots=True)
class RunLayout:
    root: Path  # the folder this process reads and writes
    uri: str = ""  # the same folder as the cluster names it (gs://...), "" when local

    @classmethod
    def at(cls, runs_dir: str, run_id: str) -> RunLayout:
        uri = f"{runs_dir.rstrip('/')}/{run_id}" if runs_dir.startswith("gs://") else ""
        return cls((local_path(runs_dir) / run_id).absolute(), uri)

    @classmethod
    def of(cls, location: str | os.PathLike[str]) -> RunLayout:
        """The run folder at `location`: a path, or a gs:// URI (read at its FUSE path)."""
        text = os.fspath(location)
        if text.startswith("gs://"):
            return cls(local_path(text).absolute(), text.rstrip("/"))
        return cls(Path(text).absolute())

    @property
    def run_id(self) -> str:
        return self.root.name

    @property
    def location(self) -> str:
        """The folder as the cluster names it: its gs:// URI, else its path."""
        return self.uri or str(self.root)

    def create(self) -> RunLayout:
        if self.root.exists() and not self.root.is_dir():
            raise LayoutError(f"run folder {self.root} exists and is not a folder")
        self.root.mkdir(parents=True, exist_ok=True)
        return self

    # -- paths ---------------------------------------------------------------------------------

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    def dir(self, stage: Stage) -> Path:
        return self.root / stage.value

    def result_path(self, stage: Stage) -> Path:
        return self.root / RESULT_FILES[stage]

    @property
    def checkpoints(self) -> str:
        """The run's own checkpoint location (a URI when the run folder is in a bucket)."""
        return f"{self.uri}/checkpoints" if self.uri else str(self.root / "checkpoints")

    @property
    def warm_start_model(self) -> Path:
        return self.dir(Stage.WARM_START) / "model"

    @property
    def train_model(self) -> Path:
        return self.dir(Stage.TRAIN) / "model"

    @property
    def train_metrics(self) -> Path:
        return self.dir(Stage.TRAIN) / "metrics.jsonl"

    @property
    def trace(self) -> Path:
        return self.dir(Stage.TRAIN) / "trace.perfetto-trace"

    def earlier_traces(self) -> list[Path]:
        return sorted(self.dir(Stage.TRAIN).glob("trace.*.perfetto-trace"))

    @property
    def resume_record(self) -> Path:
        """What the train stage restored (step, version, digest), for the recovery test."""
        return self.dir(Stage.TRAIN) / "resume.json"

    def host_record(self, process: int) -> Path:
        """What trainer process `process` of a multi-host run held at its end (step, a digest of
        each parameter shard it holds): processes that agree hold equal digests of a shard."""
        return self.dir(Stage.TRAIN) / "hosts" / f"{process}.json"

    @property
    def step_records(self) -> Path:
        """Each train step's batch, loss and parameters, when asked for (wiring/step_record.py)."""
        return self.dir(Stage.TRAIN) / "steps"

    @property
    def weights(self) -> Path:
        """Versions published to remote rollout replicas."""
        return self.dir(Stage.TRAIN) / "weights"

    @property
    def replicas(self) -> Path:
        return self.dir(Stage.TRAIN) / "replicas"

    @property
    def recovery_child(self) -> RunLayout:
        """The recovery test's own training run, inside this one."""
        return RunLayout(self.dir(Stage.RECOVERY_TEST) / "run")

    @property
    def report_html(self) -> Path:
        return self.root / "report.html"

    @property
    def report_md(self) -> Path:
        return self.root / "report.md"

    @property
    def kfp_root(self) -> Path:
        return self.root / "kfp"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    # -- results --------------------------------------------------------------------------------

    def write_text(self, path: Path, text: str) -> Path:
        write_atomic(path, text.encode())
        return path

    def write(self, result: StageResult) -> Path:
        """Write a stage's result atomically; returns its path."""
        path = self.result_path(type(result).STAGE)
        data = json.dumps(records.encode(result), indent=2, allow_nan=False) + "\n"
        return self.write_text(path, data)

    def read(self, cls: type[T]) -> T:
        """A stage's result, validated; LayoutError names the file and the problem."""
        path = self.result_path(cls.STAGE)  # type: ignore[attr-defined]
        try:
            data: Any = json.loads(path.read_bytes())
        except FileNotFoundError:
            raise LayoutError(f"{path}: no result (the stage has not finished)") from None
        except (OSError, ValueError) as e:
            raise LayoutError(f"{path}: not a readable JSON result ({e})") from None
        try:
            return records.decode(cls, data)
        except records.RecordError as e:
            raise LayoutError(f"{path}: {e}") from None

    def maybe(self, cls: type[T]) -> T | None:
        """The result when the stage is done; None when it is not (missing or malformed)."""
        try:
            return self.read(cls)
        except LayoutError:
            return None

    def done(self, cls: type) -> bool:
        return self.maybe(cls) is not None
