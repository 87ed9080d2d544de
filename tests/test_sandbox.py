"""The python sandbox against hostile programs: each is stopped with a status, nothing else harmed.

Runs for real: namespaces, rlimits and an unprivileged user where this host allows them.
"""

import asyncio
import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from asyncrl.tools.base import ToolStatus
from asyncrl.tools.executor import ToolExecutor
from asyncrl.tools.python_sandbox import PythonSandbox, SandboxLimits
from asyncrl.types import ToolCall

LIMITS = SandboxLimits(wall_s=4, cpu_s=2, memory_mb=256, output_bytes=32 * 1024, processes=16)


def run_code(code, limits=LIMITS, timeout_s=8.0):
    ex = ToolExecutor([PythonSandbox(limits)], timeout_s=timeout_s, output_chars=4000)
    return asyncio.run(ex.call(ToolCall(name="python", arguments_json=json.dumps({"code": code}))))


def _sandbox_processes():
    out = subprocess.run(["ps", "-eo", "user=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "main.py" in line and "ps -eo" not in line]


def _sandbox_dirs():
    return {p.name for p in Path(os.environ.get("TMPDIR", "/tmp")).glob("asyncrl-sandbox-*")}


def test_a_program_runs_and_prints():
    result = run_code("print(sum(range(10)))")
    assert result.status == ToolStatus.OK and result.output.strip() == "45"


def test_program_errors_are_shown_to_the_model():
    result = run_code("raise ValueError('bad input')")
    assert result.status == ToolStatus.OK
    assert "ValueError: bad input" in result.output and "[exit code 1]" in result.output


def test_no_network_not_even_loopback():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(2.0)
    port = server.getsockname()[1]
    accepted = []
    t = threading.Thread(target=lambda: accepted.append(_accept(server)))
    t.start()
    result = run_code(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
    t.join()
    server.close()
    assert "Network is unreachable" in result.output or "Connection refused" in result.output
    assert accepted == [None]


def _accept(server):
    try:
        conn, _ = server.accept()
        conn.close()
        return "connected"
    except TimeoutError:
        return None


def test_writes_outside_the_work_dir_fail_and_leave_nothing(tmp_path):
    target = tmp_path / "escaped.txt"
    tmp_target = Path("/tmp/asyncrl-escape-probe.txt")
    code = (
        f"for p in [{str(target)!r}, {str(tmp_target)!r}]:\n"
        "    try:\n        open(p, 'w').write('x'); print('wrote', p)\n"
        "    except OSError as e:\n        print('refused', p, e.errno)\n"
        "open('inside.txt', 'w').write('fine'); print(open('inside.txt').read())"
    )
    result = run_code(code)
    assert result.status == ToolStatus.OK
    assert not target.exists() and not tmp_target.exists()
    assert "fine" in result.output


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("ASYNCRL_TEST_SECRET", "hunter2")
    result = run_code(
        "import os\nprint(sorted(os.environ))\nprint(os.environ.get('ASYNCRL_TEST_SECRET'))"
    )
    assert "hunter2" not in result.output
    assert json.loads(result.output.splitlines()[0].replace("'", '"')) == [
        "HOME",
        "LANG",
        "PATH",
        "TMPDIR",
    ]


def test_memory_hog_is_stopped():
    result = run_code("x = bytearray(2 << 30)\nprint(len(x))")
    assert result.status == ToolStatus.ERROR and "memory limit" in result.error


def test_cpu_spinner_is_stopped():
    result = run_code("while True:\n    pass", SandboxLimits(wall_s=20, cpu_s=1), timeout_s=30)
    assert result.status == ToolStatus.ERROR and "CPU time limit" in result.error


def test_output_flood_is_cut():
    result = run_code("while True:\n    print('a' * 1000)")
    assert result.status == ToolStatus.OUTPUT_TRUNCATED
    assert len(result.output) <= 4000 + 20


def test_fork_bomb_is_contained_and_cleaned_up():
    before = _sandbox_processes()
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = run_code(code)
    assert result.status in (ToolStatus.TIMEOUT, ToolStatus.ERROR)
    assert _sandbox_processes() == before
    assert run_code("print('still fine')").output.strip() == "still fine"


def test_hanging_program_is_killed_at_the_deadline_and_the_work_dir_removed():
    before = _sandbox_dirs()
    result = run_code("import time\ntime.sleep(600)", SandboxLimits(wall_s=60), timeout_s=0.5)
    assert result.status == ToolStatus.TIMEOUT
    assert _sandbox_processes() == []
    assert _sandbox_dirs() == before


@pytest.mark.parametrize("n", [4])
def test_concurrent_sandboxes_do_not_interfere(n):
    async def go():
        ex = ToolExecutor([PythonSandbox(LIMITS)], timeout_s=8, output_chars=100)
        calls = [
            ToolCall(name="python", arguments_json=json.dumps({"code": f"print({i} * 7)"}))
            for i in range(n)
        ]
        return await ex.call_all(calls)

    results = asyncio.run(go())
    assert [r.output.strip() for r in results] == [str(i * 7) for i in range(n)]
