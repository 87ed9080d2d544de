"""A loopback stub of the Kubeflow Pipelines v2beta1 REST API, for tests of submit/schedule/wait.

Records every request (method, path, query, JSON body) and answers with the minimal JSON the
`kfp.Client` needs: experiments are created and found by name, runs and recurring runs get ids,
a run's state is whatever the test set in `run_states` (default SUCCEEDED). `refuse` makes every
request fail with that HTTP status and message.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


@dataclass
class KfpStub:
    host: str = ""
    requests: list[dict] = field(default_factory=list)
    run_states: dict[str, str] = field(default_factory=dict)
    experiments: dict[str, str] = field(default_factory=dict)  # name -> id
    refuse: tuple[int, str] | None = None

    def answer(self, method: str, path: str, query: dict, body: dict | None) -> tuple[int, dict]:
        self.requests.append({"method": method, "path": path, "query": query, "body": body})
        if self.refuse:
            return self.refuse[0], {"error": self.refuse[1], "message": self.refuse[1]}
        if path.endswith("/healthz"):
            return 200, {"multi_user": False}
        if path == "/apis/v2beta1/experiments" and method == "POST":
            eid = self.experiments.setdefault(body["display_name"], str(uuid.uuid4()))
            return 200, {"experiment_id": eid, "display_name": body["display_name"]}
        if path == "/apis/v2beta1/experiments" and method == "GET":
            wanted = json.dumps(query)
            found = [
                {"experiment_id": i, "display_name": n}
                for n, i in self.experiments.items()
                if n in wanted
            ]
            return 200, {"experiments": found, "total_size": len(found)}
        if path.startswith("/apis/v2beta1/experiments/"):
            eid = path.rsplit("/", 1)[1]
            name = next((n for n, i in self.experiments.items() if i == eid), "x")
            return 200, {"experiment_id": eid, "display_name": name}
        if path == "/apis/v2beta1/runs" and method == "POST":
            rid = str(uuid.uuid4())
            self.run_states.setdefault(rid, "SUCCEEDED")
            return 200, {
                "run_id": rid,
                "display_name": body.get("display_name"),
                "state": "PENDING",
            }
        if path.startswith("/apis/v2beta1/runs/") and method == "GET":
            rid = path.rsplit("/", 1)[1]
            if rid not in self.run_states:
                return 404, {"error": f"run {rid} not found", "message": f"run {rid} not found"}
            state = self.run_states[rid]
            return 200, {"run_id": rid, "state": state, "finished_at": "2026-11-29T00:00:00Z"}
        if path == "/apis/v2beta1/recurringruns" and method == "POST":
            return 200, {"recurring_run_id": str(uuid.uuid4()), **body}
        return 404, {"error": f"stub: no route {method} {path}", "message": "no route"}


@contextlib.contextmanager
def kfp_stub() -> Iterator[KfpStub]:
    stub = KfpStub()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self, method: str) -> None:
            url = urlparse(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            code, payload = stub.answer(method, url.path, parse_qs(url.query), body)
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._serve("GET")

        def do_POST(self):
            self._serve("POST")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stub.host = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
