"""The champion registry: where the current best model lives, with the metrics it was gated on.

Layout under the registry URI (a local path or gs://bucket/prefix):

    models/<run id>/            a promoted model's files and its metrics.json, written once
    CURRENT.json                the pointer: {"run_id", "model", "metrics", "previous", ...}
    history.jsonl               one line per promotion or rollback (local registries)

Promotion copies the candidate's files under `models/<run id>/` (refusing to overwrite an
existing entry, so a champion's files never change) and only then replaces `CURRENT.json` in one
write (a rename on local disk, a single-object upload on GCS): readers see the old champion or
the new one, never a mix. `rollback()` points back to the previous champion, whose files are still
there; it is the reverse of a promotion.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl import storage

POINTER = "CURRENT.json"


class RegistryError(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class Champion:
    run_id: str
    model: str  # URI of the model folder
    metrics: dict[str, Any]
    eval_key: str  # what the metrics were measured on (held-out set, sampling)
    previous: str | None


class ChampionRegistry:
    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")

    def _pointer(self) -> dict | None:
        try:
            return json.loads(storage.read_bytes(storage.join(self.uri, POINTER)))
        except FileNotFoundError:
            return None

    def current(self) -> Champion | None:
        p = self._pointer()
        if p is None:
            return None
        return Champion(
            run_id=p["run_id"],
            model=p["model"],
            metrics=p["metrics"],
            eval_key=p.get("eval_key", ""),
            previous=p.get("previous"),
        )

    def entry(self, run_id: str) -> Champion:
        base = storage.join(self.uri, "models", run_id)
        try:
            meta = json.loads(storage.read_bytes(storage.join(base, "metrics.json")))
        except FileNotFoundError:
            raise RegistryError(f"no promoted model {run_id!r} in {self.uri}") from None
        return Champion(
            run_id=run_id,
            model=storage.join(base, "model"),
            metrics=meta["metrics"],
            eval_key=meta.get("eval_key", ""),
            previous=meta.get("previous"),
        )

    def promote(
        self, run_id: str, model_dir: Path, metrics: dict[str, Any], eval_key: str
    ) -> Champion:
        base = storage.join(self.uri, "models", run_id)
        if storage.exists(storage.join(base, "metrics.json")):
            raise RegistryError(f"{run_id!r} was already promoted in {self.uri}; never overwritten")
        old = self.current()
        storage.upload_tree(Path(model_dir), storage.join(base, "model"))
        previous = old.run_id if old else None
        meta = {"metrics": metrics, "eval_key": eval_key, "previous": previous}
        storage.write_bytes(storage.join(base, "metrics.json"), json.dumps(meta).encode())
        self._point(run_id, storage.join(base, "model"), metrics, eval_key, previous, "promote")
        return self.current()

    def rollback(self) -> Champion | None:
        """Point back to the champion before the current one (None: there was none)."""
        cur = self.current()
        if cur is None or cur.previous is None:
            raise RegistryError(f"nothing to roll back to in {self.uri}")
        prev = self.entry(cur.previous)
        self._point(prev.run_id, prev.model, prev.metrics, prev.eval_key, prev.previous, "rollback")
        return self.current()

    def _point(self, run_id, model, metrics, eval_key, previous, action) -> None:
        record = {
            "run_id": run_id,
            "model": model,
            "metrics": metrics,
            "eval_key": eval_key,
            "previous": previous,
            "updated": dt.datetime.now(dt.UTC).isoformat(),
            "action": action,
        }
        storage.write_bytes(storage.join(self.uri, POINTER), json.dumps(record).encode())
        if not storage.is_gcs(self.uri):
            with Path(self.uri, "history.jsonl").open("a") as f:
                f.write(json.dumps(record) + "\n")
