"""An in-process Kubernetes API emulator (kmock) on a loopback port, for the `kubernetes` client.

kmock's `KubernetesEmulator` keeps objects in memory and serves the Kubernetes REST conventions;
it runs here on its own event loop in a background thread, so synchronous code (our JobSet runner,
which uses the official `kubernetes` client) talks to it over real HTTP. Tests change objects
(e.g. set a JobSet's status) through `call`, which runs on the emulator's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class K8sEmulator:
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


@contextlib.contextmanager
def k8s_emulator(resources: tuple[str, ...] = ()) -> Iterator[K8sEmulator]:
    """`resources`: "group/version/plural" of custom resources to serve (e.g. JobSets)."""
    import kmock

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

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    for _ in range(500):
        if "value" in ready:
            break
        threading.Event().wait(0.01)
    emulator, url, loop = ready["value"]
    try:
        yield K8sEmulator(url=url, emulator=emulator, loop=loop)
    finally:
        stop.set()
        thread.join(5)
