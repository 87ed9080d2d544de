"""The `python` tool: runs model-written code in a confined subprocess.

Each call gets a fresh temporary work directory (removed afterwards, whatever happens), a scrubbed
environment, and the limits of `SandboxLimits`; `sandbox_launcher.py` applies them before the code
runs (namespaces, rlimits, an unprivileged user). The parent enforces the wall-clock limit and the
output cap and, on timeout, cancellation or a flood of output, kills the launcher's whole process
group; the PID namespace then takes every descendant with it.

Outcomes: exit 0 → the output; a non-zero exit from the program's own error → the output with its
exit code (the model reads the traceback, as it would in a terminal); a limit that stopped the
program (CPU, memory, wall clock) → an exception, which the executor reports as error or timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

LAUNCHER = Path(__file__).with_name("sandbox_launcher.py")
REFUSED = 126


class SandboxLimitExceeded(RuntimeError):
    """The sandbox stopped the program at one of its limits."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxLimits:
    wall_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512
    output_bytes: int = 64 * 1024
    file_bytes: int = 16 << 20
    processes: int = 32
    network: Literal["deny", "allow"] = "deny"
    # Interpreter the program runs under ("" = this one, or, when dropping to nobody, the first
    # Python that nobody can execute).
    interpreter: str = ""


def _world_executable(path: str) -> bool:
    """Whether an unprivileged user can run `path` (every directory on the way searchable)."""
    real = Path(os.path.realpath(path))
    try:
        if real.stat().st_mode & 0o005 != 0o005:
            return False
        return all(p.stat().st_mode & 0o001 for p in real.parents)
    except OSError:
        return False


def default_interpreter() -> str:
    candidates = [sys.executable, "/usr/local/bin/python3", "/usr/bin/python3"]
    if os.geteuid() != 0:
        return sys.executable
    for candidate in candidates:
        if _world_executable(candidate):
            return os.path.realpath(candidate)
    raise RuntimeError("no Python interpreter the sandbox user (nobody) can execute")


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
        workdir = Path(tempfile.mkdtemp(prefix="asyncrl-sandbox-"))
        try:
            (workdir / "main.py").write_text(code)
            if os.geteuid() == 0:
                for path in (workdir, workdir / "main.py"):
                    os.chown(path, 65534, 65534)
            return await self._run(workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    async def _run(self, workdir: Path) -> str:
        limits = dataclasses.asdict(self.limits)
        limits["interpreter"] = self.limits.interpreter or default_interpreter()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            str(LAUNCHER),
            json.dumps(limits),
            cwd=workdir,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            output, flooded = await asyncio.wait_for(self._read(proc), self.limits.wall_s)
        except TimeoutError:
            raise TimeoutError(f"program ran longer than {self.limits.wall_s:g} s") from None
        finally:
            _kill_group(proc)
            await _reap(proc)
        text = output.decode("utf-8", errors="replace")
        if flooded:
            return text + f"\n…[output stopped at {self.limits.output_bytes} bytes]"
        return self._interpret(proc.returncode, text)

    async def _read(self, proc: asyncio.subprocess.Process) -> tuple[bytes, bool]:
        assert proc.stdout is not None
        chunks, size = [], 0
        while chunk := await proc.stdout.read(65536):
            chunks.append(chunk)
            size += len(chunk)
            if size > self.limits.output_bytes:
                return b"".join(chunks)[: self.limits.output_bytes], True
        await proc.wait()
        return b"".join(chunks), False

    def _interpret(self, code: int | None, text: str) -> str:
        if code == 0:
            return text
        if code == REFUSED:
            raise SandboxLimitExceeded(text.strip())
        if code is not None and code > 128:
            sig = signal.Signals(code - 128)
            reason = "CPU time limit" if sig in (signal.SIGXCPU, signal.SIGKILL) else sig.name
            raise SandboxLimitExceeded(f"stopped by {reason} ({self.limits.cpu_s} s CPU)")
        if "MemoryError" in text:
            raise SandboxLimitExceeded(f"memory limit of {self.limits.memory_mb} MB exceeded")
        return f"{text}\n[exit code {code}]"


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
