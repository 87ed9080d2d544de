"""Storage: names from a bucket (or joined onto a URI) never lead outside their folder.

Against the loopback GCS emulator: objects are uploaded under a prefix with hostile names, and
`download_tree` must refuse the whole tree before writing anything, not write it elsewhere.
"""

import uuid
from pathlib import Path

import pytest

from asyncrl import storage
from asyncrl.storage import UnsafeObjectName


def _prefix(bucket: str) -> str:
    return f"{bucket}/ckpt-{uuid.uuid4().hex[:8]}/10"


def _put(uri: str, name: str, data: bytes = b"x") -> None:
    """An object named exactly `uri/name` (storage.join would refuse the hostile ones)."""
    bucket, path = storage.split_gcs(uri)
    storage._client().bucket(bucket).blob(f"{path}/{name}").upload_from_string(data)


def test_a_tree_round_trips_and_folder_markers_are_skipped(gcs_bucket, tmp_path):
    uri = _prefix(gcs_bucket)
    _put(uri, "", b"")  # the console's marker of the prefix itself
    _put(uri, "sub/", b"")
    _put(uri, "a.bin", b"A")
    _put(uri, "sub/b.bin", b"B")
    names = storage.download_tree(uri, tmp_path / "out")
    assert names == ["a.bin", "sub/b.bin"]
    assert (tmp_path / "out" / "sub" / "b.bin").read_bytes() == b"B"


@pytest.mark.parametrize("hostile", ["/ABS/x", "a//b", "./a"])
def test_a_hostile_object_name_refuses_the_whole_download(gcs_bucket, tmp_path, hostile):
    """`ckpt/10//ABS/x` once wrote to /ABS/x; now nothing is written, not even the good object."""
    uri = _prefix(gcs_bucket)
    outside = tmp_path / "outside"
    _put(uri, "good.bin")
    _put(uri, hostile.replace("/ABS", str(outside)))
    dest = tmp_path / "dest"
    with pytest.raises(UnsafeObjectName, match="refused the name"):
        storage.download_tree(uri, dest)
    assert not dest.exists() and not outside.exists()


class _Blob:
    def __init__(self, name: str) -> None:
        self.name = name

    def download_to_filename(self, path: str) -> None:
        Path(path).write_bytes(b"x")


class _Listing:
    """A bucket listing with names the emulator itself refuses to store (real GCS keeps them)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def list_blobs(self, bucket: str, prefix: str = ""):
        return [_Blob(prefix + n) for n in self.names]


@pytest.mark.parametrize("hostile", ["../../escape", "a/../../escape", "..", "a/../", "a/.."])
def test_a_climbing_object_name_refuses_the_whole_download(monkeypatch, tmp_path, hostile):
    monkeypatch.setattr(storage, "_client", lambda: _Listing(["good.bin", hostile]))
    dest = tmp_path / "x" / "y" / "dest"
    with pytest.raises(UnsafeObjectName, match="refused the name"):
        storage.download_tree("gs://b/ckpt/10", dest)
    assert not (tmp_path / "x").exists() and not (tmp_path / "escape").exists()


def test_a_symlink_under_the_destination_cannot_lead_a_download_out(gcs_bucket, tmp_path):
    uri = _prefix(gcs_bucket)
    _put(uri, "link/x", b"payload")
    dest, elsewhere = tmp_path / "dest", tmp_path / "elsewhere"
    dest.mkdir()
    elsewhere.mkdir()
    (dest / "link").symlink_to(elsewhere)
    with pytest.raises(UnsafeObjectName, match="outside"):
        storage.download_tree(uri, dest)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("part", ["/etc/passwd", "../x", "a/../../x", ".."])
@pytest.mark.parametrize("base", ["gs://b/models", "/srv/models"])
def test_join_refuses_absolute_and_climbing_parts(base, part):
    with pytest.raises(UnsafeObjectName, match=r"absolute or '\.\.'"):
        storage.join(base, "ok", part)


def test_join_keeps_plain_parts(tmp_path):
    assert storage.join("gs://b/m/", "a", "b/c.json") == "gs://b/m/a/b/c.json"
    assert storage.join(str(tmp_path), "a", "b") == str(Path(tmp_path, "a", "b"))


def test_a_reader_with_a_size_cap_refuses_a_larger_object_before_downloading(gcs_bucket, tmp_path):
    from asyncrl import storage

    uri = f"{gcs_bucket}/capped/big"
    storage.write_bytes(uri, b"x" * 1000)
    (tmp_path / "big").write_bytes(b"x" * 1000)
    for where in (uri, str(tmp_path / "big")):
        assert storage.read_bytes(where, max_bytes=1000) == b"x" * 1000
        with pytest.raises(storage.TooLarge, match="1000 bytes, over the 999"):
            storage.read_bytes(where, max_bytes=999)
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(f"{gcs_bucket}/capped/missing", max_bytes=10)
