"""An in-process Kubernetes API server (kmock's emulator) on a loopback port.

kmock's `KubernetesEmulator` keeps objects in memory and serves the Kubernetes REST conventions
(create, get, list, patch, delete, watch; a patch merges dicts). It runs here on its own event loop
in a background thread, so synchronous code using the official `kubernetes` client talks to it
over real HTTP. What it does not do: label selectors (a list returns every object of the
namespace, so callers filter), admission, validation, garbage collection, and pods/log, which a
kubelet serves: `serve_logs` installs that route. The local JobSet executor (local_jobset.py) is
the controller and the kubelet behind it.

kmock is needed only here (the local cluster of tests and of `asyncrl run` with backend gke).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JOBSETS = "jobset.x-k8s.io/v1alpha2/jobsets"
CORE = ("v1/pods", "v1/secrets")
# pods/log: (namespace, pod, tail lines or None, timestamps) -> the log text, None if no such pod
LogSource = Callable[[str, str, int | None, bool], str | None]
_TRUE = ("1", "t", "T", "true", "True", "TRUE")  # a query bool as the API server parses it


@dataclass
class KubeEmulator:
    url: str
    emulator: Any
    loop: asyncio.AbstractEventLoop

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """Run `fn(emulator)` on the emulator's loop and return its result."""

        async def run():
            return fn(self.emulator)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def api_client(self):
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        return client.ApiClient(configuration)

    def write_kubeconfig(self, path: Path, namespace: str) -> Path:
        """A kubeconfig naming this server (no credentials: it accepts anyone on loopback)."""
        import yaml

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {"server": self.url}}],
            "users": [{"name": "local", "user": {}}],
            "contexts": [
                {
                    "name": "local",
                    "context": {"cluster": "local", "user": "local", "namespace": namespace},
                }
            ],
            "current-context": "local",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def serve_logs(self, source: LogSource) -> None:
        """Answer GET .../pods/<name>/log from `source` (tailLines and timestamps honoured)."""
        import kmock

        def log(request):
            params = dict(request.params or {})
            tail = params.get("tailLines")
            stamps = params.get("timestamps", "") in _TRUE
            text = source(request.namespace, request.name, int(tail) if tail else None, stamps)
            if text is None:
                raise kmock.KubernetesObjectNotFoundError()
            return text.encode()

        def install(emulator):
            emulator["get", kmock.subresource("log")] << log

        self.call(install)


@contextlib.contextmanager
def kube_emulator(resources: tuple[str, ...] = ()) -> Iterator[KubeEmulator]:
    """`resources`: "group/version/plural" of the resources to serve (e.g. JOBSETS, *CORE)."""
    try:
        import kmock
    except ImportError:  # pragma: no cover - an install without the local cluster's extra
        raise RuntimeError("the local Kubernetes API needs kmock: pip install kmock") from None

    ready: dict[str, Any] = {}
    stop = threading.Event()

    async def serve() -> None:
        async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
            for resource in resources:
                emulator.resources[resource] = {}
            ready["value"] = (
                emulator,
                f"http://{server.host}:{server.port}",
                asyncio.get_running_loop(),
            )
            while not stop.is_set():
                await asyncio.sleep(0.02)

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True, name="kube-api")
    thread.start()
    for _ in range(1000):
        if "value" in ready or not thread.is_alive():
            break
        threading.Event().wait(0.01)
    if "value" not in ready:
        raise RuntimeError("the local Kubernetes API did not start")
    emulator, url, loop = ready["value"]
    try:
        yield KubeEmulator(url=url, emulator=emulator, loop=loop)
    finally:
        stop.set()
        thread.join(5)
