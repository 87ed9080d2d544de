"""The `python` tool: runs model-written code in a confined subprocess.

A call gets these, and nothing is kept between calls:
  - a fresh work directory;
  - a scrubbed environment;
  - the limits of `SandboxLimits`;
  - a minimal root, in which `RootPlan` lists what is bound read-only from the host.
`sandbox_launcher.py` builds that root in fresh user, mount, PID, network, IPC, UTS and cgroup
namespaces before the code runs. It works as root and as an unprivileged trainer. Where the
kernel cannot isolate, it refuses; it never runs the program unconfined. The parent enforces
the wall clock and the output cap. On a timeout, a cancellation or a flood of output it kills
the launcher's process group, and the PID namespace takes every descendant with it.

How the launcher reports an end (a JSON line on a pipe of its own, never mixed with the program's
output) maps to one outcome:
  - exit 0 -> the output;
  - any other exit code, or death by a signal the program brought on itself -> the output with
    "[exit code N]" or "[killed by signal NAME]", as a terminal would show;
  - the CPU, memory or wall-clock limit -> `SandboxLimitExceeded` or `TimeoutError`;
  - a refusal or a broken launcher -> `SandboxUnavailable`.
The executor turns each exception into an error or timeout status.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

LAUNCHER = Path(__file__).with_name("sandbox_launcher.py")
_PROBE = (
    "import json, os, site, sys, sysconfig\n"
    "paths = [p for p in sys.path if os.path.isdir(p)]\n"
    "site_dirs = site.getsitepackages() + [sysconfig.get_path(k) for k in ('purelib', 'platlib')]\n"
    "print(json.dumps({'executable': os.path.realpath(sys.executable), 'stdlib': paths,\n"
    "    'dynload': [p for p in paths if p.endswith('lib-dynload')], 'site': site_dirs}))\n"
)
_LOADED = re.compile(r"(/\S+) \(0x[0-9a-f]+\)")
_NETWORK_FILES = ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf")


class SandboxLimitExceeded(RuntimeError):
    """The sandbox stopped the program at one of its limits."""


class SandboxUnavailable(RuntimeError):
    """The sandbox could not confine the program, so the program did not run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxLimits:
    wall_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512
    output_bytes: int = 64 * 1024
    file_bytes: int = 16 << 20
    processes: int = 32
    network: Literal["deny", "allow"] = "deny"
    # The interpreter the program runs under. "" means the one this process runs on, or its base
    # when inside a virtualenv: only the stdlib is bound, never site-packages.
    interpreter: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class RootPlan:
    """What the sandbox's root holds from the host, all read-only at the host's own paths."""

    executable: str  # resolved interpreter
    binds: tuple[str, ...]  # resolved files and directories, none inside another
    symlinks: tuple[tuple[str, str], ...]  # (link, target): /lib -> usr/lib and the like
    hidden: tuple[str, ...]  # site-packages directories inside a bind, covered by an empty tmpfs


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgramEnd:
    """How a run ended, as the launcher reports it."""

    outcome: Literal["exited", "signaled", "refused"]
    code: int = 0
    signal: int = 0
    cpu_s: float = 0.0
    reason: str = ""

    @classmethod
    def parse(cls, raw: bytes) -> ProgramEnd | None:
        try:
            record = json.loads(raw.split(b"\n", 1)[0])
            return (
                cls(**record)
                if record.get("outcome") in ("exited", "signaled", "refused")
                else None
            )
        except (ValueError, TypeError, AttributeError):
            return None


def this_interpreter() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)


@functools.cache
def root_plan(interpreter: str, network: str = "deny") -> RootPlan:
    """Ask the interpreter where its stdlib is, and its loader which libraries it and the stdlib's
    extension modules load. Cached: two short subprocesses per interpreter per process."""
    try:
        probe = subprocess.run(
            [interpreter, "-I", "-S", "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
        info = json.loads(probe.stdout)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        raise SandboxUnavailable(
            f"cannot inspect the sandbox interpreter {interpreter}: {e}"
        ) from None
    wanted = [info["executable"], *info["stdlib"]]
    wanted += _shared_libraries(info["executable"], info["dynload"])
    wanted += _links_out_of(info["stdlib"])
    wanted += ["/etc/ld.so.cache", *(_NETWORK_FILES if network == "allow" else ())]
    wanted = [p for p in wanted if os.path.exists(p)]
    binds = _outermost({os.path.realpath(p) for p in wanted})
    links = dict(link for p in wanted for link in _links_on_the_way(p))
    hidden = {os.path.realpath(d) for d in info["site"] if os.path.isdir(d)}
    return RootPlan(
        executable=info["executable"],
        binds=binds,
        symlinks=tuple(sorted(links.items())),
        hidden=tuple(sorted(d for d in hidden if _inside(d, binds) and d not in binds)),
    )


def _shared_libraries(executable: str, dynload: list[str]) -> list[str]:
    """Every library the interpreter and the stdlib's extension modules load, in one loader run."""
    modules = [p for d in dynload for p in sorted(glob.glob(f"{d}/*.so")) if " " not in p]
    try:
        traced = subprocess.run(
            [executable],
            env={"LD_TRACE_LOADED_OBJECTS": "1", "LD_PRELOAD": " ".join(modules)},
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise SandboxUnavailable(f"cannot list the libraries of {executable}: {e}") from None
    if traced.returncode != 0:
        raise SandboxUnavailable(
            f"cannot list the libraries of {executable}: {traced.stderr[-300:]}"
        )
    return _LOADED.findall(traced.stdout)


def _links_out_of(directories: list[str]) -> list[str]:
    """Symlinks at the top of the stdlib that point elsewhere (Debian's sitecustomize.py)."""
    found = []
    for d in directories:
        with contextlib.suppress(OSError), os.scandir(d) as entries:
            found += [e.path for e in entries if e.is_symlink()]
    return found


def _links_on_the_way(path: str, depth: int = 0) -> list[tuple[str, str]]:
    """The symlinks met while resolving `path`, so the root can offer the same names."""
    if depth > 16:
        return []
    links, current = [], "/"
    for part in Path(path).parts[1:]:
        if part == "..":  # `current` is resolved, so its parent is the true parent
            current = os.path.dirname(current)
            continue
        step = os.path.join(current, part)
        if os.path.islink(step):
            target = os.readlink(step)
            links.append((step, target))
            links += _links_on_the_way(os.path.join(current, target), depth + 1)
            step = os.path.realpath(step)
        current = step
    return links


def _inside(path: str, roots: tuple[str, ...] | set[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _outermost(paths: set[str]) -> tuple[str, ...]:
    kept: list[str] = []
    for p in sorted(paths, key=lambda p: (p.count("/"), p)):
        if not _inside(p, kept):
            kept.append(p)
    return tuple(sorted(kept))


class PythonSandbox:
    name = "python"
    description = "Run a Python 3 program and return what it prints (stdout and stderr)."
    schema: ClassVar[dict[str, object]] = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "a complete Python program"}},
        "required": ["code"],
        "additionalProperties": False,
    }

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()

    async def __call__(self, code: str) -> str:
        # Probed once per interpreter and process (tens of ms), then cached.
        plan = root_plan(self.limits.interpreter or this_interpreter(), self.limits.network)
        workdir = Path(tempfile.mkdtemp(prefix="asyncrl-sandbox-"))
        try:
            (workdir / "main.py").write_text(code)
            return await self._run(workdir, plan)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    async def _run(self, workdir: Path, plan: RootPlan) -> str:
        status_r, status_w = os.pipe()
        try:
            spec = {"limits": dataclasses.asdict(self.limits), "status_fd": status_w}
            spec.update(dataclasses.asdict(plan))
            (workdir / "spec.json").write_text(json.dumps(spec))
            try:
                proc = await asyncio.create_subprocess_exec(
                    this_interpreter(),
                    "-I",
                    "-",
                    cwd=workdir,
                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(status_w,),
                )
            finally:
                os.close(status_w)
            try:
                output, flooded = await asyncio.wait_for(self._read(proc), self.limits.wall_s)
            except TimeoutError:
                raise TimeoutError(f"program ran longer than {self.limits.wall_s:g} s") from None
            finally:
                _kill_group(proc)
                await _reap(proc)
            end = ProgramEnd.parse(_drain(status_r))
        finally:
            os.close(status_r)
        text = output.decode("utf-8", errors="replace")
        if flooded:
            return text + f"\n…[output stopped at {self.limits.output_bytes} bytes]"
        return self._interpret(end, text, proc.returncode)

    async def _read(self, proc: asyncio.subprocess.Process) -> tuple[bytes, bool]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(LAUNCHER.read_bytes())
        with contextlib.suppress(ConnectionError):
            await proc.stdin.drain()
        proc.stdin.close()
        chunks, size = [], 0
        while chunk := await proc.stdout.read(65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > self.limits.output_bytes:
                return b"".join(chunks)[: self.limits.output_bytes], True
        await proc.wait()
        return b"".join(chunks), False

    def _interpret(self, end: ProgramEnd | None, text: str, launcher_code: int | None) -> str:
        if end is None:
            tail = text.strip().splitlines()[-1:] or [""]
            raise SandboxUnavailable(
                f"sandbox launcher ended without a result (exit {launcher_code}): {tail[0][-200:]}"
            )
        if end.outcome == "refused":
            raise SandboxUnavailable(f"sandbox refused to run the program: {end.reason}")
        if end.outcome == "signaled":
            hard_cpu = end.signal == signal.SIGKILL and end.cpu_s >= self.limits.cpu_s
            if end.signal == signal.SIGXCPU or hard_cpu:
                raise SandboxLimitExceeded(f"stopped by CPU time limit ({self.limits.cpu_s} s CPU)")
            return f"{text}\n[killed by signal {_signal_name(end.signal)}]"
        if end.code == 0:
            return text
        if "MemoryError" in text:
            raise SandboxLimitExceeded(f"memory limit of {self.limits.memory_mb} MB exceeded")
        return f"{text}\n[exit code {end.code}]"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _drain(fd: int) -> bytes:
    """What the launcher wrote to the status pipe; never blocks."""
    os.set_blocking(fd, False)
    chunks = []
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    return b"".join(chunks)


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """Wait for the killed launcher, draining its pipe: a paused pipe never reports EOF."""
    assert proc.stdout is not None
    with contextlib.suppress(Exception):
        while await proc.stdout.read(65536):
            pass
    await proc.wait()


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
