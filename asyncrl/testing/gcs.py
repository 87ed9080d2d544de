"""A Google Cloud Storage emulator (`gcp-storage-emulator`) on a loopback port, for tests.

Points `google-cloud-storage` at it through STORAGE_EMULATOR_HOST, the variable the client library
reads, and restores the environment afterwards.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator

from asyncrl import storage


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def gcs_emulator(bucket: str = "asyncrl-test") -> Iterator[str]:
    """Run the emulator with `bucket` created; yields "gs://bucket"."""
    from gcp_storage_emulator.server import create_server

    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
    server.start()
    previous = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    storage.reset_client()
    try:
        yield f"gs://{bucket}"
    finally:
        server.stop()
        if previous is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = previous
        storage.reset_client()
