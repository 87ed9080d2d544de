"""The remote rollout channel under hostile peers and broken replicas.

A `RolloutServer` runs on loopback in a background thread around a fake engine; peers are raw
sockets (to send what no client would) or the real `RemoteEngine`. Each case asserts the exact
outcome: the error code, whether the engine saw the request, whether the replica is still alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from asyncrl.config import to_yaml
from asyncrl.sampling.protocol import EngineClosed, PromptTooLong
from asyncrl.sampling.stats import EngineStats
from asyncrl.serving import weights
from asyncrl.serving.auth import TOKEN_ENV, Token, TokenError, load_token
from asyncrl.serving.client import RemoteEngine
from asyncrl.serving.client_settings import ClientSettings
from asyncrl.serving.exchange import RemoteError
from asyncrl.serving.server import RolloutServer, ServerSettings
from asyncrl.serving.wire import ErrorCode, WireLimits, encode, request_to_json
from asyncrl.testing.configs import micro_config
from asyncrl.types import Completion, FinishReason, GenerateRequest, SamplingParams

SECRET = "s3cret-token-for-tests-0123456789"
TOKEN = Token(SECRET)
LIMITS = WireLimits(vocab_size=100, max_len=4096)
FAST = ServerSettings(read_timeout_s=0.5, write_timeout_s=1.0, max_connections=4)


class FakeEngine:
    """Replies `n_tokens` tokens (long float log-probs, so replies are big); `fail` is raised."""

    def __init__(self, n_tokens: int = 3, fail: BaseException | None = None, delay_s: float = 0):
        self.n_tokens, self.fail, self.delay_s = n_tokens, fail, delay_s
        self.requests: list[GenerateRequest] = []
        self.published: list[tuple[object, int]] = []
        self.version, self.slots_in_use, self.closed = 0, 0, False
        self.cancelled = threading.Event()
        self.stats = EngineStats()

    @property
    def exhausted(self) -> bool:
        return self.closed

    async def generate(self, request: GenerateRequest) -> Completion:
        self.requests.append(request)
        if self.fail is not None:
            raise self.fail
        try:
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        n = min(self.n_tokens, request.params.max_tokens)
        lp = (-0.12345678901234567,) * n
        return Completion(
            tokens=(7,) * n,
            logprobs=lp,
            raw_logprobs=lp,
            versions=(self.version,) * n,
            finish_reason=FinishReason.LENGTH,
            prompt_tokens=len(request.prompt),
        )

    def publish(self, params: object, version: int) -> None:
        self.published.append((params, version))
        self.version = version


@contextlib.contextmanager
def served(
    engine=None,
    *,
    root: Path | None = None,
    settings=FAST,
    load_params=None,
    limits=LIMITS,
    token: Token = TOKEN,
    model_digest: str = "",
):
    """A RolloutServer on a loopback port, served from a background thread's event loop."""
    engine = engine if engine is not None else FakeEngine()
    server = RolloutServer(
        engine,
        load_params or (lambda path: ("params", path)),
        token=token,
        limits=limits,
        weights_root=root or Path(tempfile.gettempdir()) / "no-such-weights-root",
        settings=settings,
        model_digest=model_digest,
    )
    started, box = threading.Event(), {}

    async def main() -> None:
        box["loop"], box["stop"] = asyncio.get_running_loop(), asyncio.Event()
        ready = asyncio.Event()
        task = asyncio.create_task(server.serve(ready))
        await ready.wait()
        started.set()
        await box["stop"].wait()
        task.cancel()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield server
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(10)


def ask(port: int, payload: bytes | dict, token: object = SECRET, timeout: float = 10) -> dict:
    """One raw exchange: the reply object ({} if the server closed without one)."""
    if isinstance(payload, dict):
        payload = encode(payload if token is None else {"token": token, **payload})
    with socket.create_connection(("127.0.0.1", port), timeout) as s:
        s.sendall(payload)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return json.loads(data) if data else {}


def good_request(**params) -> dict:
    p = SamplingParams(max_tokens=4, stop_tokens=(2,), seed=5)
    d = request_to_json(GenerateRequest(prompt=(1, 2, 3), params=p, session="ep-1", timeout_s=30))
    d["params"].update(params)
    return d


def client(port: int, token: Token | None = TOKEN, **kw) -> RemoteEngine:
    return RemoteEngine(
        [("127.0.0.1", port)],
        Path("/nonexistent"),
        None,
        0,
        token=token,
        settings=ClientSettings(**kw),
    )


# -- authentication ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "token",
    [None, "", SECRET[:-1], SECRET + "x", 12345, [SECRET], "\ud800" + SECRET[1:]],
    ids=["missing", "empty", "prefix", "longer", "int", "list", "lone-surrogate"],
)
def test_a_wrong_token_gets_auth_and_nothing_is_served(token):
    engine = FakeEngine()
    with served(engine) as server:
        reply = ask(server.port, {"op": "generate", "request": good_request()}, token=token)
        health = ask(server.port, {"op": "health"}, token=token)
    assert reply == health == {"ok": False, "error": "auth", "message": "authentication failed"}
    assert engine.requests == []


def test_a_wrong_token_cannot_publish(tmp_path):
    (tmp_path / "v3").mkdir()
    loaded = []
    with served(root=tmp_path, load_params=loaded.append) as server:
        reply = ask(server.port, {"op": "publish", "version": 3, "path": "v3"}, token="x" * 32)
    assert reply["error"] == "auth" and loaded == []


def test_the_token_is_never_logged_nor_printed(caplog, tmp_path):
    caplog.set_level(logging.DEBUG)
    with served() as server:
        ask(server.port, {"op": "health"}, token=SECRET[::-1])
        ask(server.port, {"op": "health"})
    assert not any(
        SECRET in r.getMessage() or SECRET[::-1] in r.getMessage() for r in caplog.records
    )
    assert SECRET not in repr(Token(SECRET)) and SECRET not in repr(client(1))


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no rollout token configured"),
        (b"", "is empty"),
        (b"\n  \n", "is empty"),
        (b"short\n", "16 to 4096 printable"),
        (b"\xff" * 20, "not UTF-8"),
        (b"x" * 5000, "over 4096 bytes"),
    ],
    ids=["no-file", "empty", "blank", "short", "binary", "huge"],
)
def test_an_unusable_token_file_refuses_service(tmp_path, content, message):
    path = None
    if content is not None:
        path = tmp_path / "token"
        path.write_bytes(content)
    with pytest.raises(TokenError, match=message) as e:
        load_token(path)
    text = (content or b"").decode(errors="replace").strip()
    assert not text or text not in str(e.value)  # the message names the file, not its content


def test_a_secret_file_with_a_trailing_newline_is_the_token(tmp_path):
    (tmp_path / "token").write_text(SECRET + "\n")
    assert load_token(tmp_path / "token").matches(SECRET)


def test_the_replica_process_refuses_to_start_without_a_token(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(to_yaml(micro_config()))
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    cmd = [sys.executable, "-m", "asyncrl.serving.replica", str(config), "--run-dir", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2
    assert "no rollout token configured: pass --token-file or set " + TOKEN_ENV in done.stderr
    assert "Traceback" not in done.stderr


def test_a_replica_whose_port_is_taken_says_so_and_announces_nothing(tmp_path):
    from asyncrl.serving.replica import ReplicaError, _serve_announced

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = RolloutServer(
            FakeEngine(),
            lambda path: None,
            token=TOKEN,
            limits=LIMITS,
            weights_root=tmp_path,
            settings=ServerSettings(port=port),
        )
        with pytest.raises(ReplicaError, match=f"cannot bind 127.0.0.1:{port}: "):
            asyncio.run(_serve_announced(server, str(tmp_path / "address")))
    assert not (tmp_path / "address").exists()


# -- framing -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload, code",
    [
        (b"this is not json\n", "bad_json"),
        (b'{"op": "health", "token": "\xff\xfe"}\n', "bad_json"),
        (b"[" * 50_000 + b"\n", "bad_json"),  # deeper than the parser's stack
        (b'{"op": "health", "n": ' + b"9" * 5000 + b"}\n", "bad_json"),  # past 4300 digits
        (b'["op", "health"]\n', "bad_request"),
        (b"\n", "bad_json"),
        (b"x" * (LIMITS.request_bytes + 10), "too_large"),
    ],
    ids=["text", "utf8", "nested", "bigint", "array", "empty-line", "over-limit"],
)
def test_malformed_bytes_get_an_error_and_the_server_stays_up(payload, code):
    engine = FakeEngine()
    with served(engine) as server:
        assert ask(server.port, payload)["error"] == code
        assert ask(server.port, {"op": "health"})["ok"] is True
    assert engine.requests == []


def test_a_peer_that_never_finishes_its_line_is_cut_off():
    with served() as server:
        start = time.monotonic()
        reply = ask(server.port, b'{"op": "hea')  # and then silence
        assert ask(server.port, {"op": "health"})["ok"] is True
    assert reply["error"] == "timeout" and time.monotonic() - start < 5


def test_an_unknown_op_is_refused():
    with served() as server:
        assert ask(server.port, {"op": "shutdown"})["error"] == "unknown_op"
        assert ask(server.port, {"op": ["health"]})["error"] == "unknown_op"


def test_connections_beyond_the_cap_get_busy_and_service_resumes():
    patient = ServerSettings(read_timeout_s=10, max_connections=4)
    with served(settings=patient) as server:
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
        time.sleep(0.1)  # each is being served (waiting for its line)
        busy = ask(server.port, {"op": "health"})
        for s in held:
            s.close()
        time.sleep(0.2)
        after = ask(server.port, {"op": "health"})
    assert busy == {"ok": False, "error": "busy", "message": "at the connection cap"}
    assert after["ok"] is True


# -- generate requests ---------------------------------------------------------------------------

BAD_REQUESTS = {
    "token-beyond-vocab": ({"prompt": [1, 100]}, "bad_request"),
    "negative-token": ({"prompt": [-1]}, "bad_request"),
    "token-beyond-int32": ({"prompt": [2**31]}, "bad_request"),
    "bool-token": ({"prompt": [True]}, "bad_request"),
    "float-token": ({"prompt": [1.5]}, "bad_request"),
    "string-token": ({"prompt": ["1"]}, "bad_request"),
    "prompt-not-a-list": ({"prompt": "1 2 3"}, "bad_request"),
    "empty-prompt": ({"prompt": []}, "bad_request"),
    "prompt-fills-context": ({"prompt": [1] * 4096}, "prompt_too_long"),
    "top-k-beyond-int32": ({"params": {"top_k": 2**40}}, "bad_request"),
    "top-k-beyond-vocab": ({"params": {"top_k": 101}}, "bad_request"),
    "max-tokens-zero": ({"params": {"max_tokens": 0}}, "bad_request"),
    "max-tokens-beyond-context": ({"params": {"max_tokens": 4097}}, "bad_request"),
    "temperature-nan": ({"params": {"temperature": float("nan")}}, "bad_request"),
    "temperature-inf": ({"params": {"temperature": float("inf")}}, "bad_request"),
    "temperature-huge": ({"params": {"temperature": 1e30}}, "bad_request"),
    "top-p-zero": ({"params": {"top_p": 0}}, "bad_request"),
    "min-p-one": ({"params": {"min_p": 1.0}}, "bad_request"),
    "penalty-negative": ({"params": {"repetition_penalty": -1}}, "bad_request"),
    "seed-beyond-int64": ({"params": {"seed": 2**64}}, "bad_request"),
    "seed-negative": ({"params": {"seed": -1}}, "bad_request"),
    "stop-token-beyond-vocab": ({"params": {"stop_tokens": [100]}}, "bad_request"),
    "too-many-stop-tokens": ({"params": {"stop_tokens": [1] * 65}}, "bad_request"),
    "stop-string-not-text": ({"params": {"stop_strings": [3]}}, "bad_request"),
    "stop-string-too-long": ({"params": {"stop_strings": ["x" * 257]}}, "bad_request"),
    "unknown-param": ({"params": {"beam_width": 4}}, "bad_request"),
    "session-not-text": ({"session": {"id": 1}}, "bad_request"),
    "timeout-negative": ({"timeout_s": -1}, "bad_request"),
    "timeout-inf": ({"timeout_s": float("inf")}, "bad_request"),
    "unknown-field": ({"priority": 1}, "bad_request"),
}


@pytest.mark.parametrize("change, code", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_a_bad_generate_request_fails_alone(change, code):
    """Refused before the engine sees it; the next good request is served as usual."""
    change = dict(change)
    request = good_request(**change.pop("params", {}))
    request.update(change)
    engine = FakeEngine()
    with served(engine) as server:
        reply = ask(server.port, {"op": "generate", "request": request})
        good = ask(server.port, {"op": "generate", "request": good_request()})
    assert reply["ok"] is False and reply["error"] == code
    assert good["ok"] is True and len(engine.requests) == 1


def test_a_missing_request_is_refused():
    with served() as server:
        assert ask(server.port, {"op": "generate"})["error"] == "bad_request"


def test_an_engine_failure_is_reported_without_its_text_and_the_replica_stays_up():
    engine = FakeEngine(fail=RuntimeError("/secret/path/on/the/replica exploded"))
    with served(engine) as server:
        reply = ask(server.port, {"op": "generate", "request": good_request()})
        health = ask(server.port, {"op": "health"})
    assert reply == {
        "ok": False,
        "error": "engine_error",
        "message": "the engine failed the request",
    }
    assert health["ok"] is True


def test_a_peer_that_hangs_up_frees_its_slot():
    engine = FakeEngine(delay_s=30)
    with served(engine) as server:
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(encode({"token": SECRET, "op": "generate", "request": good_request()}))
        time.sleep(0.2)
        s.close()
        assert engine.cancelled.wait(5)


def test_the_real_engine_survives_what_used_to_kill_it():
    """top_k and token ids beyond int32 once reached the decode thread's int32 arrays and closed
    the engine for good while health said ok; now they are refused and the engine serves on."""
    from asyncrl.model import build_model
    from asyncrl.sampling.engine import Engine

    cfg = micro_config(
        "rollout.engine_slots=1",
        "rollout.prefill_buckets=[8]",
        "rollout.attention_windows=[32]",
        "env.max_context=32",
    )
    model = build_model(cfg.model, seed=0)
    engine = Engine(model, cfg.rollout, max_len=32, seed=0)
    limits = WireLimits(vocab_size=model.cfg.vocab_size, max_len=32)
    try:
        with served(engine, limits=limits) as server:
            bad = [
                ask(server.port, {"op": "generate", "request": good_request(top_k=2**40)}),
                ask(
                    server.port,
                    {"op": "generate", "request": {**good_request(), "prompt": [2**31]}},
                ),
            ]
            good = ask(server.port, {"op": "generate", "request": good_request()})
            health = ask(server.port, {"op": "health"})
    finally:
        engine.close()
    assert [r["error"] for r in bad] == ["bad_request", "bad_request"]
    assert good["ok"] and 1 <= len(good["completion"]["tokens"]) <= 4
    assert health == {"ok": True, "version": 0, "slots_in_use": 0, "model": ""}


# -- a closed engine -----------------------------------------------------------------------------


def test_a_closed_engine_is_reported_by_health_and_the_client_marks_the_replica_dead():
    engine = FakeEngine()
    with served(engine) as server:
        remote = client(server.port)
        assert remote.health()[f"127.0.0.1:{server.port}"]["ok"] is True
        engine.closed = True
        assert ask(server.port, {"op": "health"})["error"] == "engine_closed"
        remote.health()
    assert remote.exhausted and remote.lost == [f"127.0.0.1:{server.port}"]
    assert remote.replicas[0].cause == "engine_closed: the engine is closed"


def test_a_request_to_a_closed_engine_marks_the_replica_dead():
    engine = FakeEngine(fail=EngineClosed("the engine was closed"))
    with served(engine) as server:
        remote = client(server.port)
        with pytest.raises(EngineClosed, match="engine_closed"):
            asyncio.run(remote.generate(GenerateRequest(prompt=(1, 2))))
        with pytest.raises(EngineClosed, match=r"no live rollout replica \(.*engine_closed"):
            asyncio.run(remote.generate(GenerateRequest(prompt=(1, 2))))
    assert remote.exhausted


# -- the client ----------------------------------------------------------------------------------


def test_a_completion_over_64_kib_reaches_the_client():
    engine = FakeEngine(n_tokens=3000)
    with served(engine) as server:
        remote = client(server.port)
        request = GenerateRequest(prompt=(1,), params=SamplingParams(max_tokens=3000))
        completion = asyncio.run(remote.generate(request))
    assert len(completion.tokens) == 3000 and LIMITS.reply_bytes > 3000 * 80 > 2**16
    assert remote.stats.generated_tokens == 3000 and not remote.exhausted


def test_a_reply_over_the_clients_limit_fails_the_request_not_the_client():
    with served(FakeEngine(n_tokens=3000)) as server:
        remote = client(server.port, max_reply_bytes=2**16)
        request = GenerateRequest(prompt=(1,), params=SamplingParams(max_tokens=3000))
        with pytest.raises(RemoteError, match="reply_too_large") as e:
            asyncio.run(remote.generate(request))
    assert e.value.code == ErrorCode.REPLY_TOO_LARGE and not remote.exhausted


def test_a_refused_request_raises_remote_error_and_the_replica_stays_alive():
    with served() as server:
        remote = client(server.port)
        with pytest.raises(RemoteError, match=r"bad_request: request\.prompt\[0\]") as e:
            asyncio.run(remote.generate(GenerateRequest(prompt=(500,))))
        with pytest.raises(PromptTooLong):
            asyncio.run(remote.generate(GenerateRequest(prompt=(1,) * 4096)))
    assert e.value.code == ErrorCode.BAD_REQUEST and remote.live == remote.replicas


def test_a_client_without_the_token_marks_the_replica_dead_naming_auth(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with served() as server:
        remote = client(server.port, token=None)
        with pytest.raises(EngineClosed, match=r"\(auth\)"):
            asyncio.run(remote.generate(GenerateRequest(prompt=(1,))))
    assert remote.exhausted and "refused our token" in remote.replicas[0].cause


def test_the_client_reads_the_token_file_named_by_the_environment(monkeypatch, tmp_path):
    (tmp_path / "token").write_text(SECRET)
    monkeypatch.setenv(TOKEN_ENV, str(tmp_path / "token"))
    with served() as server:
        assert client(server.port, token=None).health()[f"127.0.0.1:{server.port}"]["ok"]


@contextlib.contextmanager
def fake_replica(reply: bytes | None):
    """A listener that answers every connection with `reply` (None: never answers)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.recv(65536)
            if reply is not None:
                conn.sendall(reply)
                conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


@pytest.mark.parametrize(
    "reply, cause",
    [
        (b"garbage\n", "bad_json"),
        (b'{"ok": true, "completion": {"tokens": [1]}}\n', "bad_reply: malformed completion"),
        (
            b'{"ok": true, "completion": {"tokens": [1], "logprobs": [], "raw_logprobs": [],'
            b' "versions": [], "finish_reason": "stop", "prompt_tokens": 1,'
            b' "cached_tokens": 0}}\n',
            "bad_reply: malformed completion",
        ),
        (b'{"ok": false, "error": "no-such-code"}\n', "bad_reply"),
        (b'{"result": 1}\n', "bad_reply: a reply without ok"),
        (b'{"ok": true, "compl', "engine_closed: no answer"),  # cut mid-reply
        (None, "engine_closed: no answer"),  # silent past the deadline
    ],
    ids=["garbage", "missing-fields", "ragged-columns", "unknown-code", "no-ok", "cut", "silent"],
)
def test_a_replica_that_breaks_the_protocol_is_marked_dead(reply, cause):
    with fake_replica(reply) as port:
        remote = client(port, reply_grace_s=0.3)
        request = GenerateRequest(prompt=(1,), timeout_s=0.2)
        with pytest.raises(EngineClosed, match="is gone"):
            asyncio.run(remote.generate(request))
    assert remote.exhausted and remote.replicas[0].cause.startswith(cause)


# -- publish -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, version, code",
    [
        ("/etc", 3, "bad_path"),
        ("/root/.ssh", 3, "bad_path"),
        ("../v3", 3, "bad_path"),
        ("v3/../../etc", 3, "bad_path"),
        ("gs://other-bucket/weights/v3", 3, "bad_path"),
        ("v4", 3, "bad_path"),  # not the version announced
        ("v03", 3, "bad_path"),
        (["v3"], 3, "bad_path"),
        ("v3", -1, "bad_request"),
        ("v3", True, "bad_request"),
        ("v3", 2**40, "bad_request"),
        ("vlink", 3, "bad_path"),
    ],
)
def test_publish_loads_only_a_version_folder_under_the_root(tmp_path, path, version, code):
    root = tmp_path / "weights"
    (root / "v3").mkdir(parents=True)
    loaded = []
    with served(root=root, load_params=loaded.append) as server:
        reply = ask(server.port, {"op": "publish", "version": version, "path": path})
    assert reply["ok"] is False and reply["error"] == code and loaded == []
    assert str(tmp_path) not in reply["message"]


def test_a_symlinked_version_folder_leading_out_is_refused(tmp_path):
    root, outside = tmp_path / "weights", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "v5").symlink_to(outside)
    loaded = []
    with served(root=root, load_params=loaded.append) as server:
        reply = ask(server.port, {"op": "publish", "version": 5, "path": "v5"})
    assert reply["error"] == "bad_path" and loaded == []


def test_a_failed_load_names_the_version_not_the_path_or_the_exception(tmp_path):
    def load(path: str):
        raise OSError(f"{path}/model.safetensors: corrupt header")

    engine = FakeEngine()
    with served(engine, root=tmp_path, load_params=load) as server:
        reply = ask(server.port, {"op": "publish", "version": 7, "path": "v7"})
        health = ask(server.port, {"op": "health"})
    assert reply == {
        "ok": False,
        "error": "load_failed",
        "message": "weights version 7 could not be loaded",
    }
    assert health == {"ok": True, "version": 0, "slots_in_use": 0, "model": ""}


def test_publish_loads_each_version_and_the_trainer_keeps_the_last_two(tmp_path):
    engine = FakeEngine()
    with served(engine, root=tmp_path) as server:
        remote = RemoteEngine(
            [("127.0.0.1", server.port)],
            tmp_path,
            lambda params, folder: folder.mkdir(),
            0,
            token=Token(SECRET),
        )
        for version in range(1, 5):
            remote.publish(f"params-{version}", version)
            _wait_for(lambda v=version: len(engine.published) == v)
        _wait_for(lambda: weights.versions(tmp_path) == [3, 4])  # pruned after the last answer
    assert [v for _, v in engine.published] == [1, 2, 3, 4]
    assert engine.published[-1][0] == ("params", str(tmp_path.resolve() / "v4"))
    assert weights.versions(tmp_path) == [3, 4]


def test_a_publish_is_announced_to_every_live_replica_at_once(tmp_path):
    """Each replica's load waits at a barrier until the other's load has begun: a client that
    announced to one replica only after the other had answered would break the barrier (both
    loads fail, neither replica holds v1). A third, silent address fails alone."""
    barrier = threading.Barrier(2, timeout=10)  # far past a concurrent publish's few ms

    def load_params(path: str) -> tuple[str, str]:
        barrier.wait()
        return ("params", path)

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        silent = s.getsockname()[1]
    engines = [FakeEngine(), FakeEngine()]
    with (
        served(engines[0], root=tmp_path, load_params=load_params) as a,
        served(engines[1], root=tmp_path, load_params=load_params) as b,
    ):
        ports = (a.port, silent, b.port)
        remote = RemoteEngine(
            [("127.0.0.1", p) for p in ports],
            tmp_path,
            lambda _, folder: folder.mkdir(),
            0,
            token=TOKEN,
        )
        remote.publish("params-1", 1)
        _wait_for(lambda: all(e.version == 1 for e in engines) and not remote.replicas[1].alive)
        remote.close()
    assert [e.published for e in engines] == [[(("params", str(tmp_path.resolve() / "v1")), 1)]] * 2
    assert [r.alive for r in remote.replicas] == [True, False, True] and not barrier.broken
    assert remote.replicas[1].cause == "engine_closed: no answer (refused, reset or timed out)"
    assert remote.lost == [f"127.0.0.1:{silent}"]


def test_after_each_publish_a_replica_serves_what_a_model_loaded_from_the_folder_serves(tmp_path):
    """The replica loads every version into its own model (none is built per publish); its
    completions then equal, token for token and log-prob for log-prob, those of an engine on a
    model built afresh and loaded from the same folder, version after version."""
    from asyncrl.model import build_model
    from asyncrl.model import hf_checkpoint as hf
    from asyncrl.sampling.engine import Engine
    from asyncrl.serving.replica import weights_loader

    cfg = micro_config(
        "rollout.engine_slots=1",
        "rollout.prefill_buckets=[8]",
        "rollout.attention_windows=[32]",
        "env.max_context=32",
    )
    request = GenerateRequest(prompt=(1, 2, 3), params=SamplingParams(max_tokens=6, seed=5))

    def engine_on(model):
        return Engine(model, cfg.rollout, max_len=32, seed=0)

    def save(model, folder: Path) -> None:  # the trainer's (wiring/training.remote_engine)
        hf.save(model, str(folder))

    own = build_model(cfg.model, seed=0)
    replica, served_by = engine_on(own), {}
    limits = WireLimits(vocab_size=cfg.model.vocab_size, max_len=32)
    try:
        with served(replica, root=tmp_path, load_params=weights_loader(own), limits=limits) as s:
            remote = RemoteEngine([("127.0.0.1", s.port)], tmp_path, save, 0, token=TOKEN)
            for version in (1, 2):
                remote.publish(build_model(cfg.model, seed=version), version)
                _wait_for(lambda v=version: replica.version == v)
                served_by[version] = asyncio.run(remote.generate(request))
            remote.close()
    finally:
        replica.close()
    for version, completion in served_by.items():
        fresh = build_model(cfg.model, seed=100)
        hf.load_into(fresh, str(tmp_path / weights.folder_name(version)))
        reference = engine_on(fresh)
        try:
            expected = asyncio.run(reference.generate(request))
        finally:
            reference.close()
        assert completion.versions == (version,) * len(completion.tokens)
        assert (completion.tokens, completion.logprobs) == (expected.tokens, expected.logprobs)
    assert served_by[1].logprobs != served_by[2].logprobs  # the weights did change between them


def _wait_for(condition, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def test_pruning_touches_only_old_version_folders(tmp_path):
    for name in ("v1", "v2", "v3", "v9", "v03", "notes"):
        (tmp_path / name).mkdir()
    (tmp_path / "v0").symlink_to(tmp_path / "notes")
    assert weights.prune(tmp_path, newest=3, keep=2) == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "v03", "v2", "v3", "v9"]


# -- as an unprivileged user ---------------------------------------------------------------------


def _serve_as_uid_1000(token_file: Path, ready_w: int) -> int:
    """Fork a child that drops to uid/gid 1000 (no supplementary groups), then loads the token
    and serves; it writes "<uid> <port>" or "refused <error>" to `ready_w`. A fork, not an exec:
    the interpreter of this environment may sit where uid 1000 cannot run it."""
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: never returns into pytest
        os.setgroups([])
        os.setgid(1000)
        os.setuid(1000)
        try:
            token = load_token(token_file)
        except TokenError as e:
            os.write(ready_w, f"refused {e}\n".encode())
            os._exit(3)
        root = token_file.parent
        server = RolloutServer(
            FakeEngine(), lambda p: p, token=token, limits=LIMITS, weights_root=root, settings=FAST
        )

        async def main() -> None:
            ready = asyncio.Event()
            task = asyncio.create_task(server.serve(ready))
            await ready.wait()
            os.write(ready_w, f"{os.getuid()} {server.port}\n".encode())
            await task

        asyncio.run(main())
    finally:
        os._exit(0)


def _read_line(fd: int, timeout_s: float = 20) -> str:
    deadline, data = time.monotonic() + timeout_s, b""
    os.set_blocking(fd, False)
    while not data.endswith(b"\n") and time.monotonic() < deadline:
        try:
            data += os.read(fd, 4096)
        except BlockingIOError:
            time.sleep(0.01)
    return data.decode().strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to uid 1000 needs root")
# JAX warns on any fork once it has threads; the child never touches JAX, and a hung child is
# killed when the parent's 20 s read deadline passes, so a deadlock fails the test, never hangs it.
@pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
def test_the_server_runs_as_uid_1000_and_refuses_a_token_it_cannot_read():
    home = Path(tempfile.mkdtemp(prefix="asyncrl-uid1000-"))
    os.chmod(home, 0o711)
    mine, roots = home / "token", home / "root-token"
    for path in (mine, roots):
        path.write_text(SECRET)
        path.chmod(0o600)
    os.chown(mine, 1000, 1000)
    pids = []
    try:
        r, w = os.pipe()
        pids.append(_serve_as_uid_1000(roots, w))
        refused = _read_line(r)
        assert refused.startswith("refused cannot read the rollout token file")
        assert refused.endswith("Permission denied") and SECRET not in refused
        pids.append(_serve_as_uid_1000(mine, w))
        uid, port = map(int, _read_line(r).split())
        assert uid == 1000
        assert ask(port, {"op": "health"}, token="wrong" * 8)["error"] == "auth"
        reply = ask(port, {"op": "generate", "request": good_request()})
        assert reply["ok"] is True and reply["completion"]["tokens"] == [7, 7, 7]
        bad = ask(port, {"op": "generate", "request": good_request(top_k=2**40)})
        assert bad["error"] == "bad_request" and ask(port, {"op": "health"})["ok"] is True
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
            os.waitpid(pid, 0)
        for path in (mine, roots):
            path.unlink()
        home.rmdir()


# -- a replica that comes back -------------------------------------------------------------------
# A replica "restarts" as a new server (a new engine that starts at version 0) on the same port.


def test_probe_delays_double_up_to_the_cap_with_jitter():
    import random

    from asyncrl.serving.admission import Backoff

    backoff, rng = Backoff(base_s=0.5, max_s=8.0), random.Random(0)
    for attempt in range(12):
        ceiling = min(8.0, 0.5 * 2**attempt)
        delays = [backoff.delay(attempt, rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert max(delays) - min(delays) > ceiling / 4  # jittered, not one fixed wait
    assert backoff.delay(10**6, rng) <= 8.0  # no overflow, still capped
    for bad in ((0.0, 1.0), (2.0, 1.0), (1.0, float("inf"))):
        with pytest.raises(ValueError, match="Backoff"):
            Backoff(base_s=bad[0], max_s=bad[1])


def _probing_client(ports: list[int], root: Path, **kw) -> RemoteEngine:
    return RemoteEngine(
        [("127.0.0.1", p) for p in ports],
        root,
        lambda params, folder: folder.mkdir(),
        0,
        token=TOKEN,
        # Probes of a peer that is shutting down or hung must fail fast (the defaults wait 10 s
        # for a connection and for a health reply, as long as the tests wait for a re-admission).
        settings=ClientSettings(
            probe_interval_s=0.05,
            probe_max_backoff_s=0.2,
            connect_timeout_s=1.0,
            health_timeout_s=1.0,
            **kw,
        ),
    )


def _on_port(port: int) -> ServerSettings:
    return ServerSettings(port=port, read_timeout_s=0.5, write_timeout_s=1.0, max_connections=4)


def test_a_restarted_replica_catches_up_to_the_current_version_and_serves_again(tmp_path):
    from asyncrl.serving.admission import ReplicaState

    other = FakeEngine()
    with served(FakeEngine(), root=tmp_path) as first, served(other, root=tmp_path) as spare:
        port = first.port
        remote = _probing_client([port, spare.port], tmp_path)
        remote.publish("params-1", 1)
        _wait_for(lambda: other.version == 1)
    with served(other, root=tmp_path, settings=_on_port(spare.port)):
        # The first replica is gone: the request in flight on it fails (the orchestrator retries
        # it), the next goes to the other replica, and a publish reaches only the live one.
        with pytest.raises(EngineClosed, match=f"127.0.0.1:{port} is gone"):
            asyncio.run(remote.generate(GenerateRequest(prompt=(1, 2))))
        assert [r.alive for r in remote.replicas] == [False, True]
        assert asyncio.run(remote.generate(GenerateRequest(prompt=(1, 2)))).versions == (1, 1, 1)
        remote.publish("params-2", 2)
        _wait_for(lambda: other.version == 2)

        back = FakeEngine()
        with served(back, root=tmp_path, settings=_on_port(port)):
            _wait_for(lambda: remote.replicas[0].alive)
            # Live only once it holds the current weights, loaded from the version folder.
            assert remote.replicas[0].alive and back.requests == []
            assert back.published == [(("params", str(tmp_path.resolve() / "v2")), 2)]
            completion = asyncio.run(remote.generate(GenerateRequest(prompt=(1, 2))))
            assert len(back.requests) == 1 and completion.versions == (2, 2, 2)
    remote.close()
    mine = [(t.state, t.version) for t in remote.transitions if t.replica == f"127.0.0.1:{port}"]
    assert mine == [
        (ReplicaState.ALIVE, None),
        (ReplicaState.DEAD, None),
        (ReplicaState.READMITTED, 2),
    ]
    assert remote.lost == [f"127.0.0.1:{port}"] and remote.replicas[0].admissions == 1


@pytest.mark.parametrize(
    "comes_back_with, refused",
    [
        ({"token": Token("another-token-0123456789abcdef")}, "auth: it refused our token"),
        ({"model_digest": "another-model"}, "incompatible: it serves model another-mode"),
    ],
    ids=["another-token", "another-model"],
)
def test_a_replica_that_comes_back_with_another_token_or_model_is_not_readmitted(
    tmp_path, comes_back_with, refused
):
    engine = FakeEngine()
    with served(engine, model_digest="mine") as first:
        port = first.port
        remote = _probing_client([port], tmp_path, model_digest="mine")
        assert remote.health()[f"127.0.0.1:{port}"]["ok"] is True
        remote.publish("params-1", 1)
        _wait_for(lambda: engine.version == 1)  # announced before the replica goes
    start = time.monotonic()  # no probe before the death
    with pytest.raises(EngineClosed):
        asyncio.run(remote.generate(GenerateRequest(prompt=(1,))))
    stranger = FakeEngine()
    with served(stranger, root=tmp_path, settings=_on_port(port), **comes_back_with):
        _wait_for(lambda: remote.replicas[0].probes >= 4)
        held_s = time.monotonic() - start
        replica = remote.replicas[0]
        assert not replica.alive and replica.probe_error.startswith(refused)
        assert stranger.published == [] and stranger.requests == []  # nothing reached it
        # Backed off, never a busy loop: at least 0.025 s before the first probe and 0.1 s
        # between later ones (interval 0.05 s, cap 0.2 s, each wait at least half its value).
        assert replica.probes <= 2 + held_s / 0.05
    with served(FakeEngine(), root=tmp_path, settings=_on_port(port), model_digest="mine"):
        _wait_for(lambda: remote.replicas[0].alive)  # the right one is admitted on the same port
        assert remote.replicas[0].alive
    remote.close()


def test_health_marks_a_live_replica_serving_another_model_dead():
    with served(model_digest="theirs") as server:
        remote = client(server.port, model_digest="mine")
        reply = remote.health()[f"127.0.0.1:{server.port}"]
        remote.close()
    assert reply["ok"] is False and remote.exhausted
    assert remote.replicas[0].cause.startswith("incompatible: it serves model theirs")
