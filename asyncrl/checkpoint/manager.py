"""`Checkpointer`: Orbax checkpoints of the learner state plus the JSON pipeline state.

One step's checkpoint holds two Orbax items: `train_state` (params, optimizer state, step; a flat
map of named arrays, written by `StandardSave`) and `pipeline` (`JsonSave`: data cursor, policy
version, RNG scheme, metrics history, resolved config and its hash, and a SHA-256 digest of every
saved array). Orbax writes a step into a temporary directory and renames it when complete, so a
save killed half-way is never listed, and `cleanup_tmp_directories` removes its leftovers.

For a `gs://bucket/prefix` location Orbax writes into a local staging directory and the finished
step is mirrored with `google-cloud-storage`, object by object, with a `COMMIT` object written last:
a step without `COMMIT` (an upload cut short) is ignored and deleted. Restore downloads the newest
committed step into staging and restores it with Orbax. Restores check the digest (a corrupted
checkpoint is an error, not a silently different model) and the config's compatibility.

On a trainer spanning several hosts every process makes the same calls in the same order (Orbax's
multi-host path: each process writes its own shards, process 0 the metadata and the JSON item), the
digest gathers arrays spread over processes (a collective), and the location must be a folder
every host sees (the run folder, on Cloud Storage FUSE in a JobSet): the gs:// mirror stages on
one host's disk, so it is refused there.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging as absl_logging
from jax.sharding import NamedSharding

from asyncrl import storage
from asyncrl.learner.lockstep import whole
from asyncrl.learner.step import TrainState

COMMIT = "COMMIT"
ITEMS = ("train_state", "pipeline")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be restored: missing, corrupted, or made by another config."""


def _make_folder(local: Path, uri: str) -> None:
    """Create the checkpoint folder; a file (or a file above it) in the way is a clear error."""
    try:
        local.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise CheckpointError(
            f"checkpoint.dir: {uri!r:.200} is a file, or lies under one; allowed: a folder "
            "(or a path not yet made); the default is <run folder>/checkpoints"
        ) from None
    except PermissionError as e:
        raise CheckpointError(
            f"checkpoint.dir: cannot create {uri!r:.200} ({e.strerror})"
        ) from None


def flatten(tree: Any) -> dict[str, Any]:
    """Leaves by a readable name derived from their path (`params.layers.0.attn.q.kernel`)."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = re.sub(r"[^A-Za-z0-9_]+", ".", jax.tree_util.keystr(path)).strip(".")
        out[name] = leaf
    if len(out) != len(jax.tree.leaves(tree)):
        raise ValueError("two leaves flatten to the same name")
    return out


def unflatten(template: Any, flat: Mapping[str, Any]) -> Any:
    names = list(flatten(template))
    missing = [n for n in names if n not in flat]
    if missing or len(flat) != len(names):
        extra = sorted(set(flat) - set(names))
        raise CheckpointError(
            f"checkpoint arrays differ from the model's: missing {missing[:5]}, "
            f"unexpected {extra[:5]}"
        )
    return jax.tree.unflatten(jax.tree.structure(template), [flat[n] for n in names])


def digest(flat: Mapping[str, Any]) -> str:
    """SHA-256 over every array's name, dtype, shape and bytes (in name order)."""
    h = hashlib.sha256()
    flat = whole(dict(flat))
    for name in sorted(flat):
        a = flat[name]
        h.update(f"{name}:{a.dtype}:{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


class Checkpointer:
    def __init__(
        self,
        uri: str,
        *,
        max_to_keep: int = 3,
        async_save: bool = True,
        staging: Path | None = None,
    ) -> None:
        self.uri = uri
        self.remote = storage.is_gcs(uri)
        if self.remote and jax.process_count() > 1:
            raise CheckpointError(
                f"checkpoint.dir: {uri!r:.200} on a multi-host trainer; allowed: a folder every "
                "host sees, such as the run folder (Cloud Storage FUSE in a JobSet), since the "
                "gs:// mirror stages each step on one host's disk"
            )
        if self.remote:
            self._staging = staging or Path(tempfile.mkdtemp(prefix="asyncrl-ckpt-"))
            local = self._staging
            local.mkdir(parents=True, exist_ok=True)
        else:
            local = Path(uri).absolute()
            _make_folder(local, uri)
        self.local = local
        self.max_to_keep = max_to_keep
        self._mngr = self._manager(async_save)

    def _manager(self, async_save: bool) -> ocp.CheckpointManager:
        # Orbax reports every save phase at INFO through absl; a run's log needs only its
        # warnings. Set here, where a checkpointer is made, so importing this module changes
        # nothing.
        absl_logging.set_verbosity(absl_logging.WARNING)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=self.max_to_keep,
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,
            create=True,
        )
        return ocp.CheckpointManager(self.local, options=options, item_names=ITEMS)

    # -- saving ---------------------------------------------------------------------------------

    def save(self, state: TrainState, pipeline: Mapping[str, Any]) -> int:
        """Start saving at `state.step` (in the background when async); returns the step."""
        step = int(state.step)
        flat = flatten(state)
        record = dict(pipeline) | {"step": step, "digest": digest(flat)}
        self._mngr.save(
            step,
            args=ocp.args.Composite(
                train_state=ocp.args.StandardSave(flat), pipeline=ocp.args.JsonSave(record)
            ),
            force=True,
        )
        if self.remote:  # the mirror needs the finished step
            self._mngr.wait_until_finished()
            self._mirror(step)
        return step

    def wait(self) -> None:
        """Block until every started save is finalized (and mirrored)."""
        self._mngr.wait_until_finished()

    def _mirror(self, step: int) -> None:
        target = storage.join(self.uri, str(step))
        storage.delete_tree(target)  # a previous, uncommitted attempt at this step
        storage.upload_tree(self.local / str(step), target)
        storage.write_bytes(storage.join(target, COMMIT), b"")
        # The newest max_to_keep committed steps, counting those this process never staged (a
        # resumed run stages only the step it restored): pruning never outruns max_to_keep.
        done = sorted(set(self.steps()) | set(self._mngr.all_steps()))
        keep = {str(s) for s in done[-self.max_to_keep :]}
        for name in storage.list_names(self.uri):
            if name.isdigit() and name not in keep:
                storage.delete_tree(storage.join(self.uri, name))

    # -- restoring ------------------------------------------------------------------------------

    def steps(self) -> list[int]:
        """Complete steps, oldest first."""
        if not self.remote:
            self._mngr.reload()
            return sorted(self._mngr.all_steps())
        names = storage.list_names(self.uri)
        done = []
        for name in names:
            if name.isdigit() and storage.exists(storage.join(self.uri, name, COMMIT)):
                done.append(int(name))
        return sorted(done)

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def read_pipeline(self, step: int) -> dict[str, Any]:
        self._fetch(step)
        try:
            restored = self._mngr.restore(
                step, args=ocp.args.Composite(pipeline=ocp.args.JsonRestore())
            )
        except Exception as e:
            raise CheckpointError(
                f"checkpoint step {step} at {self.uri}: unreadable pipeline state ({e})"
            ) from e
        return dict(restored["pipeline"])

    def restore(self, template: TrainState, step: int | None = None) -> tuple[TrainState, dict]:
        """The train state (placed like `template`) and the pipeline state of `step` (latest)."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no complete checkpoint at {self.uri}")
        self._fetch(step)
        names = flatten(template)
        abstract = {
            n: jax.ShapeDtypeStruct(np.shape(a), a.dtype, sharding=getattr(a, "sharding", None))
            for n, a in names.items()
        }
        try:
            restored = self._mngr.restore(
                step,
                args=ocp.args.Composite(
                    train_state=ocp.args.StandardRestore(abstract),
                    pipeline=ocp.args.JsonRestore(),
                ),
            )
        except Exception as e:  # Orbax/tensorstore raise many kinds for damaged files
            raise CheckpointError(
                f"checkpoint step {step} at {self.uri} cannot be read: {type(e).__name__}: {e}"
            ) from e
        flat, pipeline = dict(restored["train_state"]), dict(restored["pipeline"])
        if digest(flat) != pipeline.get("digest"):
            raise CheckpointError(
                f"checkpoint step {step} at {self.uri} is corrupted: its arrays do not match the "
                "digest recorded when it was saved"
            )
        # Leaves the template had on one device (optimizer counters, scalars) come back
        # uncommitted, so jit may place them beside the mesh-sharded parameters as before.
        for name, a in names.items():
            if not isinstance(getattr(a, "sharding", None), NamedSharding):
                flat[name] = jnp.asarray(np.asarray(flat[name]))
        return unflatten(template, flat), pipeline

    def _fetch(self, step: int) -> None:
        if not self.remote or (self.local / str(step)).is_dir():
            return
        tmp = self.local / f".download-{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            names = storage.download_tree(storage.join(self.uri, str(step)), tmp)
        except storage.UnsafeObjectName as e:  # names the object; nothing was written
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(
                f"checkpoint step {step} at {self.uri} holds an object with an unsafe name, "
                f"refused before anything was downloaded: {e}"
            ) from None
        if COMMIT not in names:
            raise CheckpointError(f"checkpoint step {step} at {self.uri} was never committed")
        (tmp / COMMIT).unlink()
        tmp.rename(self.local / str(step))
        self._mngr.reload()

    def close(self) -> None:
        self._mngr.wait_until_finished()
        self._mngr.close()
        if self.remote:
            shutil.rmtree(self._staging, ignore_errors=True)
