"""The python sandbox against escapes, one test per way out, as the trainer and as uid 1000.

"trainer" runs the tool in this process. When that process is root, "uid1000" runs it in a
subprocess under `setpriv --reuid 1000`: the path a non-root trainer takes, with user namespaces
in place of root's privileges. Each program prints JSON, and the test asserts what it saw.
"""

import asyncio
import dataclasses
import functools
import json
import os
import shutil
import socket
import subprocess
import textwrap
import uuid
from pathlib import Path

import pytest

from asyncrl.tools import python_sandbox
from asyncrl.tools.base import ToolStatus
from asyncrl.tools.executor import ToolExecutor
from asyncrl.tools.python_sandbox import PythonSandbox, SandboxLimits
from asyncrl.types import ToolCall

REPO = Path(__file__).resolve().parents[1]
LIMITS = SandboxLimits(wall_s=8, cpu_s=2, memory_mb=256, output_bytes=32 * 1024, processes=16)
UNPRIVILEGED = 1000
DRIVER = """
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
from asyncrl.tools.python_sandbox import PythonSandbox, SandboxLimits
request = json.load(sys.stdin)
try:
    text = asyncio.run(PythonSandbox(SandboxLimits(**request["limits"]))(request["code"]))
    print(json.dumps({"status": "ok", "text": text}))
except TimeoutError as e:
    print(json.dumps({"status": "timeout", "text": str(e)}))
except Exception as e:
    print(json.dumps({"status": "error", "text": f"{type(e).__name__}: {e}"}))
"""


def _here(code, limits):
    try:
        return "ok", asyncio.run(PythonSandbox(limits)(code))
    except TimeoutError as e:
        return "timeout", str(e)
    except Exception as e:
        return "error", f"{type(e).__name__}: {e}"


@functools.cache
def _unprivileged_python():
    """(interpreter, None) for running the tool as uid 1000, or (None, why that is impossible)."""
    if os.geteuid() != 0:
        return None, f"tests already run unprivileged (uid {os.geteuid()}): 'trainer' is that case"
    if shutil.which("setpriv") is None:
        return None, "setpriv (util-linux) is not installed, so uid 1000 cannot be assumed"
    check = (
        "import ctypes, os, sys\n"
        "usable = os.access(os.path.realpath(sys.executable), os.X_OK)\n"
        "usable = usable and os.access(sys.argv[1], os.R_OK | os.X_OK)\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(int(usable), libc.unshare(0x10000000), ctypes.get_errno())"
    )
    for python in dict.fromkeys(
        [python_sandbox.this_interpreter(), "/usr/bin/python3", "/usr/local/bin/python3"]
    ):
        if not os.path.exists(python):
            continue
        probe = _as_uid_1000([python, "-I", "-c", check, str(REPO)], "")
        if probe.returncode != 0 or probe.stdout.split()[:1] != ["1"]:
            continue  # uid 1000 cannot run this interpreter again, or cannot read the repo
        _, ret, errno = probe.stdout.split()
        if ret != "0":
            why = os.strerror(int(errno))
            return None, f"the kernel forbids unprivileged user namespaces (unshare: {why})"
        return python, None
    return None, f"no Python interpreter that uid 1000 can execute and that can read {REPO}"


def _as_uid_1000(argv, stdin):
    ids = ["--reuid", str(UNPRIVILEGED), "--regid", str(UNPRIVILEGED), "--clear-groups"]
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    return subprocess.run(
        ["setpriv", *ids, *argv], input=stdin, capture_output=True, text=True, env=env, timeout=60
    )


def _as_unprivileged(code, limits):
    python, why = _unprivileged_python()
    if python is None:
        pytest.skip(why)
    request = json.dumps({"code": code, "limits": dataclasses.asdict(limits)})
    done = _as_uid_1000([python, "-I", "-c", DRIVER, str(REPO)], request)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["status"], result["text"]


@pytest.fixture(params=["trainer", "uid1000"])
def run(request):
    runner = _here if request.param == "trainer" else _as_unprivileged

    def go(code, limits=LIMITS):
        return runner(textwrap.dedent(code), limits)

    go.unprivileged = request.param == "uid1000" or os.geteuid() != 0
    return go


def _json(status_text):
    status, text = status_text
    assert status == "ok", text
    return json.loads(text.strip().splitlines()[-1])


def test_project_files_are_not_readable(run):
    secret = (REPO / "pyproject.toml").read_text().splitlines()[0]
    seen = _json(
        run(f"""
        import json, os
        seen = {{"root": sorted(os.listdir("/"))}}
        for path in [{str(REPO / "pyproject.toml")!r}, {str(REPO)!r}, {__file__!r}]:
            try:
                is_file = path.endswith((".toml", ".py"))
                seen[path] = open(path).read() if is_file else os.listdir(path)
            except OSError as e:
                seen[path] = type(e).__name__
        print(json.dumps(seen))
    """)
    )
    for path in (REPO / "pyproject.toml", REPO, Path(__file__)):
        assert seen[str(path)] == "FileNotFoundError"
    assert secret not in json.dumps(seen)
    # The sandbox's root is its own skeleton; a checkout under one of the skeleton's names
    # (/tmp, /root, /usr) is covered by the FileNotFoundError checks above.
    skeleton = {"bin", "dev", "etc", "lib", "lib64", "proc", "root", "run", "sbin", "tmp", "usr"}
    assert {"dev", "etc", "proc", "run", "tmp"} <= set(seen["root"]) <= skeleton
    assert REPO.parts[1] in skeleton or REPO.parts[1] not in seen["root"]


def test_host_passwd_and_etc_are_not_visible(run):
    host_users = {
        line.split(":")[0] for line in Path("/etc/passwd").read_text().splitlines() if line
    }
    assert host_users - {"root", "sandbox"}, (
        "the host passwd must hold other users for this test to mean anything"
    )
    seen = _json(
        run("""
        import json, os
        print(json.dumps({"passwd": open("/etc/passwd").read(), "etc": sorted(os.listdir("/etc"))}))
    """)
    )
    users = {line.split(":")[0] for line in seen["passwd"].splitlines()}
    assert users == {"root", "sandbox"}
    assert set(seen["etc"]) - {"passwd", "group", "ld.so.cache"} <= {
        n for n in seen["etc"] if n.startswith("python3")
    }


def test_proc_shows_only_the_sandbox_processes(run):
    seen = _json(
        run("""
        import json, os
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        cmdlines = [open(f"/proc/{p}/cmdline").read() for p in pids]
        seen = {"pids": pids, "me": os.getpid(), "cmdlines": cmdlines}
        for probe in ("/proc/1/environ", "/proc/1/root"):
            try:
                os.listdir(probe) if probe.endswith("root") else open(probe).read()
                seen[probe] = "readable"
            except OSError as e:
                seen[probe] = type(e).__name__
        print(json.dumps(seen))
    """)
    )
    assert seen["pids"] == [1, 2] and seen["me"] == 2
    assert not any(
        "/work" in c or "sandbox_launcher" in c or "pytest" in c for c in seen["cmdlines"]
    )
    assert seen["/proc/1/environ"] == seen["/proc/1/root"] == "PermissionError"


def _accepted(server):
    """Whether a connection reached the socket (it waits in the backlog until accepted)."""
    server.setblocking(False)
    try:
        server.accept()[0].close()
        return True
    except BlockingIOError:
        return False


def _connect_program(address):
    return textwrap.dedent(f"""
        import json, os, socket
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect({address!r})
            print(json.dumps("connected"))
        except OSError as e:
            print(json.dumps(type(e).__name__))
    """)


def test_a_host_unix_socket_under_run_is_unreachable(run):
    if not os.access("/run", os.W_OK):
        pytest.skip("/run is not writable here, so no host socket can be placed there")
    path = f"/run/asyncrl-test-{uuid.uuid4().hex[:8]}.sock"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(path)
        os.chmod(path, 0o777)
        server.listen(1)
        with socket.socket(socket.AF_UNIX) as probe:  # reachable from the host: the test can fail
            probe.connect(path)
        server.accept()[0].close()
        status, text = run(_connect_program(path) + "print(json.dumps(os.listdir('/run')))\n")
        accepted = _accepted(server)
    finally:
        server.close()
        os.unlink(path)
    assert status == "ok" and [json.loads(line) for line in text.splitlines()] == [
        "FileNotFoundError",
        ["lock"],
    ]
    assert not accepted


def test_an_abstract_unix_socket_of_the_host_is_unreachable(run):
    name = f"\0asyncrl-test-{uuid.uuid4().hex[:8]}"
    server = socket.socket(socket.AF_UNIX)
    server.bind(name)
    server.listen(1)
    try:
        status, text = run(_connect_program(name))
    finally:
        accepted = _accepted(server)
        server.close()
    assert (status, json.loads(text)) == ("ok", "ConnectionRefusedError")
    assert not accepted


def test_run_lock_tmp_and_shm_do_not_persist_between_calls(run):
    paths = ["/run/lock/probe", "/tmp/probe", "/dev/shm/probe", "/tmp/work/probe"]
    wrote = _json(
        run(f"""
        import json
        for p in {paths!r}:
            open(p, "w").write("left behind")
        print(json.dumps([open(p).read() for p in {paths!r}]))
    """)
    )
    assert wrote == ["left behind"] * len(paths)
    found = _json(
        run(f"import json, os\nprint(json.dumps([os.path.exists(p) for p in {paths!r}]))")
    )
    assert found == [False] * len(paths)
    assert not os.path.exists("/run/lock/probe")


def test_a_background_process_does_not_outlive_its_call(run):
    status, _ = run("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            time.sleep(30)
        print("parent done")
    """)
    assert status == "ok"
    seen = _json(
        run(
            "import json, os\n"
            "print(json.dumps(sorted(int(p) for p in os.listdir('/proc') if p.isdigit())))"
        )
    )
    assert seen == [1, 2]
    ps = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout
    assert not [line for line in ps.splitlines() if "main.py" in line]


def test_the_root_is_read_only(run):
    seen = _json(
        run("""
        import errno, json
        seen = {}
        for p in ["/etc/passwd", "/new-file", "/usr/new-file", "/proc/sys/kernel/hostname"]:
            try:
                open(p, "a").write("x")
                seen[p] = "written"
            except OSError as e:
                seen[p] = errno.errorcode[e.errno]
        print(json.dumps(seen))
    """)
    )
    # Files the program owns (uid 1000 case: the root's files are its own) are refused as read-only.
    refused = {"EROFS"} if run.unprivileged else {"EROFS", "EACCES"}
    assert seen["/etc/passwd"] in refused and seen["/new-file"] in refused
    assert seen["/usr/new-file"] in refused | {"ENOENT"}
    assert seen["/proc/sys/kernel/hostname"] in ("EACCES", "EPERM")


def test_the_program_holds_no_privilege(run):
    seen = _json(
        run("""
        import ctypes, json, os
        lines = open("/proc/self/status").read().splitlines()
        status = dict(line.split(":\\t") for line in lines if ":\\t" in line)
        libc = ctypes.CDLL(None, use_errno=True)
        nested = libc.unshare(0x10000000)  # CLONE_NEWUSER: capabilities again, if it were allowed
        print(json.dumps({"uid": os.getuid(), "cap": status["CapEff"].strip(),
                          "nnp": status["NoNewPrivs"].strip(), "nested": nested,
                          "host": os.uname().nodename}))
    """)
    )
    expected_uid = UNPRIVILEGED if run.unprivileged else 65534
    if run.unprivileged and os.geteuid() != 0:
        expected_uid = os.geteuid()
    assert seen == {
        "uid": expected_uid,
        "cap": "0" * 16,
        "nnp": "1",
        "nested": -1,
        "host": "sandbox",
    }


def test_the_program_cannot_signal_the_sandbox_init(run):
    # As root's sandbox the program is another uid (EPERM); as uid 1000 the kernel drops them.
    status, text = run("""
        import os, signal, time
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            try:
                os.kill(1, s)
            except PermissionError:
                pass
        time.sleep(0.2)
        print("still here")
    """)
    assert (status, text) == ("ok", "still here\n")


@pytest.mark.parametrize("code", [0, 1, 130, 255])
def test_exit_codes_map_to_output(run, code):
    status, text = run(f"import sys\nprint('hi')\nsys.exit({code})")
    assert status == "ok"
    assert text == ("hi\n" if code == 0 else f"hi\n\n[exit code {code}]")


@pytest.mark.parametrize("name", ["SIGTERM", "SIGSEGV", "SIGKILL"])
def test_a_program_killed_by_a_signal_maps_to_output(run, name):
    status, text = run(
        f"import os, signal\nprint('hi', flush=True)\nos.kill(os.getpid(), signal.{name})"
    )
    assert (status, text) == ("ok", f"hi\n\n[killed by signal {name}]")


def _call(code):
    ex = ToolExecutor([PythonSandbox(LIMITS)], timeout_s=10, output_chars=4000)
    return asyncio.run(ex.call(ToolCall(name="python", arguments_json=json.dumps({"code": code}))))


def test_a_broken_launcher_is_an_error_never_program_output(tmp_path, monkeypatch):
    fake = tmp_path / "launcher.py"
    fake.write_text("raise RuntimeError('launcher traceback')\n")
    monkeypatch.setattr(python_sandbox, "LAUNCHER", fake)
    result = _call("print('never runs')")
    assert result.status == ToolStatus.ERROR and result.output == ""
    assert result.error.startswith(
        "SandboxUnavailable: sandbox launcher ended without a result (exit 1)"
    )


def test_a_refusal_is_an_error_with_its_reason(tmp_path, monkeypatch):
    fake = tmp_path / "launcher.py"
    fake.write_text(
        "import json, os\nspec = json.load(open('spec.json'))\nprint('noise')\n"
        "record = {'outcome': 'refused', 'reason': 'no user namespaces'}\n"
        "os.write(spec['status_fd'], json.dumps(record).encode())\n"
    )
    monkeypatch.setattr(python_sandbox, "LAUNCHER", fake)
    result = _call("print('never runs')")
    assert (result.status, result.output) == (ToolStatus.ERROR, "")
    assert (
        result.error == "SandboxUnavailable: sandbox refused to run the program: no user namespaces"
    )


def test_network_allow_still_confines_the_filesystem():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    limits = SandboxLimits(wall_s=8, cpu_s=2, memory_mb=256, network="allow")
    try:
        status, text = _here(
            "import os, socket\n"
            f"socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
            f"print(os.path.exists({str(REPO)!r}))",
            limits,
        )
    finally:
        accepted = _accepted(server)
        server.close()
    assert (status, text, accepted) == ("ok", "False\n", True)
