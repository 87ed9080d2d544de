"""A loopback GKE API (container.googleapis.com v1, REST): the node pools of the local cluster.

Just enough of the API for `cloud/provision.py`: a node pool is absent until created, then
PROVISIONING for `polls_to_run` reads, then RUNNING; delete removes it. Every request is recorded;
`refuse` answers each with that (HTTP status, gRPC status, message), `refuse_create` only the
creation of the pools it names. No credentials are checked: it listens on loopback only. Used by
the local cluster (local_cluster.py) and by tests.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class LocalGkeApi:
    endpoint: str = ""
    requests: list[tuple[str, str, dict | None]] = field(default_factory=list)
    pools: dict[str, int] = field(default_factory=dict)  # path -> reads since creation
    polls_to_run: int = 1
    refuse: tuple[int, str, str] | None = None
    refuse_create: dict[str, tuple[int, str, str]] = field(default_factory=dict)  # by pool name


@contextlib.contextmanager
def local_gke_api() -> Iterator[LocalGkeApi]:
    stub = LocalGkeApi()

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, obj: dict) -> None:
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self, method: str) -> None:
            path = self.path.split("?")[0]
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            stub.requests.append((method, path, body))
            if stub.refuse:
                code, status, message = stub.refuse
                return self._send(
                    code, {"error": {"code": code, "status": status, "message": message}}
                )
            if method == "POST" and body["nodePool"]["name"] in stub.refuse_create:
                code, status, message = stub.refuse_create[body["nodePool"]["name"]]
                return self._send(
                    code, {"error": {"code": code, "status": status, "message": message}}
                )
            if method == "POST":
                name = f"{path}/{body['nodePool']['name']}"
                stub.pools[name] = 0
                return self._send(200, {"name": "operation-create", "status": "RUNNING"})
            if path not in stub.pools:
                return self._send(
                    404, {"error": {"code": 404, "status": "NOT_FOUND", "message": "no such pool"}}
                )
            if method == "DELETE":
                del stub.pools[path]
                return self._send(200, {"name": "operation-delete", "status": "RUNNING"})
            stub.pools[path] += 1
            running = stub.pools[path] > stub.polls_to_run
            return self._send(200, {"name": path.rsplit("/", 1)[1], "status": 2 if running else 1})

        def do_GET(self):
            self._handle("GET")

        def do_POST(self):
            self._handle("POST")

        def do_DELETE(self):
            self._handle("DELETE")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stub.endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
