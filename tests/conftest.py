"""Test session set-up: 4 virtual CPU devices (meshes, disaggregated placement), float32."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest


@pytest.fixture(scope="session")
def gcs_bucket():
    """A gs:// bucket on a loopback GCS emulator, shared by the session's tests."""
    from asyncrl.testing.gcs import gcs_emulator

    with gcs_emulator() as bucket:
        yield bucket
