"""Bytes at a URI: a local path or `gs://bucket/object`, through `google-cloud-storage`.

Owns the one place that turns a URI into reads and writes, so model import, checkpoints and run
artifacts accept either kind. It does not cache and keeps no state beyond the lazily made client.
Against a local emulator the client is pointed by STORAGE_EMULATOR_HOST, which the google library
itself reads; anonymous credentials are used then because an emulator has no auth.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

GCS_PREFIX = "gs://"


def is_gcs(uri: str) -> bool:
    return uri.startswith(GCS_PREFIX)


def split_gcs(uri: str) -> tuple[str, str]:
    """("bucket", "path/inside") of a gs:// URI."""
    bucket, _, path = uri[len(GCS_PREFIX) :].partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} names no bucket; expected gs://bucket/path")
    return bucket, path.strip("/")


def join(uri: str, *parts: str) -> str:
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


def read_bytes(uri: str) -> bytes:
    if is_gcs(uri):
        bucket, path = split_gcs(uri)
        blob = _client().bucket(bucket).blob(path)
        from google.api_core.exceptions import NotFound

        try:
            return blob.download_as_bytes()
        except NotFound:
            raise FileNotFoundError(uri) from None
    return Path(uri).read_bytes()


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
    """Copy every object under the gs:// prefix `uri` into `local_dir`; returns relative paths."""
    bucket, path = split_gcs(uri)
    prefix = f"{path}/" if path else ""
    names = []
    for blob in _client().list_blobs(bucket, prefix=prefix):
        name = blob.name[len(prefix) :]
        target = local_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(target))
        names.append(name)
    return sorted(names)


def delete_tree(uri: str) -> None:
    """Delete every object under a gs:// prefix (a local directory tree for a local path)."""
    if is_gcs(uri):
        bucket, path = split_gcs(uri)
        for blob in _client().list_blobs(bucket, prefix=f"{path}/"):
            blob.delete()
        return
    import shutil

    shutil.rmtree(uri, ignore_errors=True)
