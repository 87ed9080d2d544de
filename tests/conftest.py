"""Test session set-up: 4 virtual CPU devices (meshes, disaggregated placement), float32."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the session and every process it starts (kfp.local runs
# each component in a subprocess): a jitted step compiled once is loaded, not recompiled.
_CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import pytest


@pytest.fixture(scope="session")
def gcs_bucket():
    """A gs:// bucket on a loopback GCS emulator, shared by the session's tests."""
    from asyncrl.testing.gcs import gcs_emulator

    with gcs_emulator() as bucket:
        yield bucket
