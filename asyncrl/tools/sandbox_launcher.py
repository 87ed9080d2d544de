"""Started by `python_sandbox.py` as a fresh interpreter; confines itself, then runs main.py.

Run as `python -I sandbox_launcher.py LIMITS_JSON` with the work directory as cwd. It imports only
the standard library and runs before any user code:
  1. new mount, network and PID namespaces (as root directly, otherwise inside a user namespace):
     no network interfaces but a down loopback; private tmpfs over /tmp, /var/tmp and /dev/shm,
     where the program runs in /tmp/work;
  2. fork: the child is PID 1 of the new PID namespace and dies with this launcher, and when it
     exits the kernel kills every process it left behind (fork bombs included);
  3. in the child: resource limits (CPU seconds, address space, file size, process count, open
     files, no core dumps), then, as root, drop to nobody:nogroup; then exec Python on main.py.
If `network` is "deny" and the namespaces cannot be created, it refuses to run (exit 126).
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
PR_SET_PDEATHSIG = 1
NOBODY = 65534
REFUSED = 126


def _isolate(libc, file_bytes: int) -> bool:
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
    if os.geteuid() != 0:
        uid, gid = os.geteuid(), os.getegid()
        if libc.unshare(flags | CLONE_NEWUSER) != 0:
            return False
        for path, text in (
            ("setgroups", "deny"),
            ("uid_map", f"0 {uid} 1"),
            ("gid_map", f"0 {gid} 1"),
        ):
            with open(f"/proc/self/{path}", "w") as f:
                f.write(text)
    elif libc.unshare(flags) != 0:
        return False
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return False
    size = f"size={max(file_bytes, 1 << 20)},mode=1777".encode()
    for target in (b"/tmp", b"/var/tmp", b"/dev/shm"):
        if os.path.isdir(target) and libc.mount(b"tmpfs", target, b"tmpfs", 0, size) != 0:
            return False
    return True


def _limit(limits: dict) -> None:
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = int(limits["memory_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limits["file_bytes"]),) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (int(limits["processes"]),) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main() -> int:
    limits = json.loads(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    with open("main.py", "rb") as f:
        program = f.read()
    isolated = _isolate(libc, int(limits["file_bytes"]))
    if limits["network"] == "deny" and not isolated:
        sys.stderr.write("sandbox: cannot isolate the network on this host; refusing to run\n")
        return REFUSED
    if isolated:
        # The work directory now lives in the private /tmp and disappears with the namespace.
        os.makedirs("/tmp/work", mode=0o777, exist_ok=True)
        os.chmod("/tmp/work", 0o777)
        os.chdir("/tmp/work")
        with open("main.py", "wb") as f:
            f.write(program)
    pid = os.fork()
    if pid == 0:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        _limit(limits)
        if os.geteuid() == 0:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": os.getcwd(),
            "TMPDIR": os.getcwd(),
            "LANG": "C.UTF-8",
        }
        python = limits["interpreter"]
        os.execve(python, [python, "-I", "-B", "main.py"], env)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main())
