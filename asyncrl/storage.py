"""Bytes at a URI: a local path or `gs://bucket/object`, through `google-cloud-storage`.

Owns the one place that turns a URI into reads and writes, so model import, checkpoints and run
artifacts accept either kind. It does not cache and keeps no state beyond the lazily made client.
Invariant: a name from outside (an object listed in a bucket, a part joined onto a URI) never
leads out of its folder: absolute names, `..` and empty segments are refused with
`UnsafeObjectName`, and every download target is resolved and checked to stay under its
destination before any byte is written.
Against a local emulator the client is pointed by STORAGE_EMULATOR_HOST, which the google library
itself reads; anonymous credentials are used then because an emulator has no auth.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

GCS_PREFIX = "gs://"


class UnsafeObjectName(ValueError):
    """An object or path name that would lead outside the folder it belongs to."""


def check_relative(name: str, where: str) -> str:
    """`name` if it is a relative path of plain segments (no "", ".", ".." segment, no NUL)."""
    if not name or "\x00" in name or any(s in ("", ".", "..") for s in name.split("/")):
        raise UnsafeObjectName(
            f"{where}: refused the name {name!r:.120}: a relative path of plain segments is "
            "required (no leading '/', no '..', '.' or empty segments)"
        )
    return name


def is_gcs(uri: str) -> bool:
    return uri.startswith(GCS_PREFIX)


def split_gcs(uri: str) -> tuple[str, str]:
    """("bucket", "path/inside") of a gs:// URI."""
    bucket, _, path = uri[len(GCS_PREFIX) :].partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} names no bucket; expected gs://bucket/path")
    return bucket, path.strip("/")


def join(uri: str, *parts: str) -> str:
    """`uri` with `parts` appended; a part that is absolute or climbs out with `..` is refused."""
    for part in parts:
        if part.startswith("/") or ".." in part.split("/"):
            raise UnsafeObjectName(f"{uri}: refused to join {part!r:.120} (absolute or '..')")
    if is_gcs(uri):
        return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts)])
    return str(Path(uri, *parts))


@functools.cache
def _client():
    from google.cloud import storage

    if os.environ.get("STORAGE_EMULATOR_HOST"):
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project="emulator", credentials=AnonymousCredentials())
    return storage.Client()


def reset_client() -> None:
    """Forget the cached client (after the emulator's address changed)."""
    _client.cache_clear()


class TooLarge(ValueError):
    """An object over the size its reader accepts."""


def read_bytes(uri: str, max_bytes: int | None = None) -> bytes:
    """The object's bytes; with `max_bytes`, one larger is refused (TooLarge) before download."""
    if is_gcs(uri):
        bucket, path = split_gcs(uri)
        from google.api_core.exceptions import NotFound

        try:
            if max_bytes is None:  # one request, as before
                return _client().bucket(bucket).blob(path).download_as_bytes()
            blob = _client().bucket(bucket).get_blob(path)  # its size first
            if blob is None:
                raise FileNotFoundError(uri)
            _check_size(uri, blob.size, max_bytes)
            return blob.download_as_bytes()
        except NotFound:
            raise FileNotFoundError(uri) from None
    if max_bytes is not None:
        _check_size(uri, Path(uri).stat().st_size, max_bytes)
    return Path(uri).read_bytes()


def _check_size(uri: str, size: int | None, max_bytes: int | None) -> None:
    if max_bytes is not None and (size is None or size > max_bytes):
        raise TooLarge(f"{uri}: {size} bytes, over the {max_bytes} this reader accepts")


def write_bytes(uri: str, data: bytes) -> None:
    if is_gcs(uri):
        bucket, path = split_gcs(uri)
        _client().bucket(bucket).blob(path).upload_from_string(data)
        return
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def exists(uri: str) -> bool:
    if is_gcs(uri):
        bucket, path = split_gcs(uri)
        return _client().bucket(bucket).blob(path).exists()
    return Path(uri).exists()


def list_names(uri: str) -> list[str]:
    """Names directly under a directory URI, sorted."""
    if is_gcs(uri):
        bucket, path = split_gcs(uri)
        prefix = f"{path}/" if path else ""
        blobs = _client().list_blobs(bucket, prefix=prefix, delimiter="/")
        names = [b.name[len(prefix) :] for b in blobs]
        return sorted(names + [p[len(prefix) :].rstrip("/") for p in blobs.prefixes])
    directory = Path(uri)
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def upload_tree(local_dir: Path, uri: str) -> list[str]:
    """Copy every file under `local_dir` to `uri/<relative path>`; returns the relative paths."""
    names = sorted(str(p.relative_to(local_dir)) for p in local_dir.rglob("*") if p.is_file())
    for name in names:
        write_bytes(join(uri, name), (local_dir / name).read_bytes())
    return names


def download_tree(uri: str, local_dir: Path) -> list[str]:
    """Copy every object under the gs:// prefix `uri` into `local_dir`; returns relative paths.

    Every name is checked (and its target resolved inside `local_dir`) before anything is
    written, so one unsafe name refuses the whole tree. Folder placeholders ("a/") are skipped.
    """
    bucket, path = split_gcs(uri)
    prefix = f"{path}/" if path else ""
    dest = Path(local_dir).resolve()
    planned = []
    for blob in _client().list_blobs(bucket, prefix=prefix):
        name = blob.name[len(prefix) :]
        where = f"gs://{bucket}/{blob.name}"
        if not name or name.endswith("/"):  # a folder marker (console-made): nothing to write
            if name:
                check_relative(name[:-1], where)
            continue
        target = (dest / check_relative(name, where)).resolve()
        if not target.is_relative_to(dest):  # a symlink already under local_dir leads out
            raise UnsafeObjectName(f"{where}: would be written outside {local_dir}")
        planned.append((blob, name, target))
    for blob, _, target in planned:
        target.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(target))
    return sorted(name for _, name, _ in planned)


def delete_tree(uri: str) -> None:
    """Delete every object under a gs:// prefix (a local directory tree for a local path)."""
    if is_gcs(uri):
        bucket, path = split_gcs(uri)
        for blob in _client().list_blobs(bucket, prefix=f"{path}/"):
            blob.delete()
        return
    import shutil

    shutil.rmtree(uri, ignore_errors=True)
