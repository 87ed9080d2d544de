"""Confines one program, then runs it. `python_sandbox.py` feeds this source to `python -I -`.

The source comes in on stdin, so no host path shows in a command line the program can read. The
work directory holds `main.py` and `spec.json` (`RootPlan`, limits, the status pipe's fd number).
Only the standard library is imported, and all of it runs before any user code.
  launcher -- stays in the host namespaces; forks C, writes C's uid/gid maps, then waits.
  C        -- unshare(user, mount, PID, IPC, UTS, cgroup, and net unless allowed); forks G.
  G        -- PID 1 of the new PID namespace. It builds the new root, mounts /proc, calls
              pivot_root and detaches the old root. Then it forks the program P, reaps, and
              writes how P ended to the status pipe. When G exits the kernel kills what is left.
The new root is a read-only tmpfs that holds only these:
  - read-only binds of the interpreter, its stdlib and the libraries they load (site-packages
    covered);
  - a two-line /etc/passwd and /etc/group;
  - /dev/{null,zero,full,random,urandom};
  - a fresh /proc;
  - fresh tmpfs at /tmp (the work dir is /tmp/work), /dev/shm and /run.
Everything is gone when the namespaces die, so nothing persists between calls.

Identity: the user namespace maps 0->0 (for setup) and 65534->65534 (the program) when the
trainer is root. Otherwise it maps the trainer's own uid to itself. The program is never uid 0
there: exec clears its capabilities and no_new_privs is set. Wherever /proc could be mounted, it
may not create user namespaces either (when the kernel refuses that mount, /proc stays empty).

A failure before the program starts is reported as {"outcome": "refused", "reason": ...}. The
program never runs unconfined, and setup errors never reach its output.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 1024, 2048, 4096, 0x4000
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
NOBODY = 65534
DEVICES = ("null", "zero", "full", "random", "urandom")
# Flags the kernel locks on a bind made in a user namespace: a remount must repeat them.
LOCKED = {
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOEXEC: MS_NOEXEC,
    os.ST_NOATIME: MS_NOATIME,
    os.ST_NODIRATIME: MS_NODIRATIME,
    os.ST_RELATIME: MS_RELATIME,
}
libc = ctypes.CDLL(None, use_errno=True)


class Refused(Exception):
    """Setup failed; the program must not run."""


def _b(text):
    return None if text is None else text.encode()


def _check(what, ret):
    if ret != 0:
        raise Refused(f"{what}: {os.strerror(ctypes.get_errno())}")


def _mount(src, target, fstype, flags, data=None):
    ret = libc.mount(_b(src), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data))
    _check(f"mount {fstype or 'bind'} on {target}", ret)


def _bind(src, target, extra):
    _mount(src, target, None, MS_BIND)
    kept = os.statvfs(target).f_flag
    locked = sum(flag for st, flag in LOCKED.items() if kept & st)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | extra | locked)


def _tmpfs(target, data, flags=MS_NOSUID | MS_NODEV):
    os.makedirs(target, exist_ok=True)
    _mount("tmpfs", target, "tmpfs", flags, data)


def _write(path, text, mode=0o644):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def _report(fd, **record):
    os.write(fd, json.dumps(record).encode() + b"\n")


def _guarded(status, step, *args):
    """Run a forked process's step; any failure is reported as a refusal. Never returns."""
    try:
        step(*args)
    except BaseException as e:  # whatever broke, the program must not run
        reason = str(e) if isinstance(e, Refused) else f"{type(e).__name__}: {e}"
        _report(status, outcome="refused", reason=reason)
    os._exit(1)


def _build_root(root, spec, uid, gid):
    _tmpfs(root, "size=1m,nr_inodes=4096,mode=755")
    for name in ("etc", "proc", ".old"):
        os.mkdir(f"{root}/{name}", 0o755)
    size = max(int(spec["limits"]["file_bytes"]), 1 << 20)
    _tmpfs(f"{root}/tmp", f"size={size},nr_inodes=16384,mode=1777")
    _tmpfs(f"{root}/run", "size=64k,nr_inodes=256,mode=755")
    os.mkdir(f"{root}/run/lock", 0o1777)
    os.chmod(f"{root}/run/lock", 0o1777)
    _build_dev(f"{root}/dev", size)
    for path in spec["binds"]:  # mount points first: nothing is created once binds are in place
        os.makedirs(os.path.dirname(root + path), exist_ok=True)
        if os.path.isdir(path):
            os.makedirs(root + path, exist_ok=True)
        elif not os.path.exists(root + path):
            open(root + path, "w").close()
    for link, target in spec["symlinks"]:
        os.makedirs(os.path.dirname(root + link), exist_ok=True)
        if not os.path.lexists(root + link):
            os.symlink(target, root + link)
    _write(
        f"{root}/etc/passwd",
        f"root:x:0:0::/:/bin/false\nsandbox:x:{uid}:{gid}::/tmp/work:/bin/false\n",
    )
    _write(f"{root}/etc/group", f"root:x:0:\nsandbox:x:{gid}:\n")
    for path in spec["binds"]:
        _bind(path, root + path, MS_NODEV)
    for path in spec["hidden"]:
        _tmpfs(
            root + path,
            "size=4k,nr_inodes=16,mode=755",
            MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
        )


def _build_dev(dev, size):
    _tmpfs(dev, "size=64k,nr_inodes=64,mode=755", MS_NOSUID | MS_NOEXEC)
    for name in DEVICES:
        open(f"{dev}/{name}", "w").close()
        _bind(f"/dev/{name}", f"{dev}/{name}", MS_NOEXEC)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{dev}/{name}")
    _tmpfs(f"{dev}/shm", f"size={size},nr_inodes=4096,mode=1777")
    _mount(None, dev, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)


def _mount_proc(root):
    """A /proc of the new PID namespace; without it (the kernel may refuse) /proc stays empty."""
    proc = f"{root}/proc"
    if libc.mount(b"proc", proc.encode(), b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        return
    # A nested user namespace would hand the program capabilities again: allow none.
    with open(f"{proc}/sys/user/max_user_namespaces", "w") as f:
        f.write("0")


def _pivot(root):
    number = SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise Refused(f"pivot_root: unsupported architecture {os.uname().machine}")
    _check("pivot_root", libc.syscall(ctypes.c_long(number), _b(root), _b(f"{root}/.old")))
    os.chdir("/")
    _check("detach the old root", libc.umount2(b"/.old", MNT_DETACH))
    os.rmdir("/.old")
    kept = os.statvfs("/").f_flag
    locked = sum(flag for st, flag in LOCKED.items() if kept & st)
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | locked)


def _limit(limits):
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = int(limits["memory_mb"]) << 20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limits["file_bytes"]),) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (int(limits["processes"]),) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _program(spec, uid, gid, failed_w):
    """P: limits, identity, exec. A failure before exec reaches G over `failed_w` (cloexec)."""
    try:
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        _limit(spec["limits"])
        if os.getuid() != uid:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
        _check("no_new_privs", libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
        os.chdir("/tmp/work")
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": "/tmp/work",
            "TMPDIR": "/tmp/work",
            "LANG": "C.UTF-8",
        }
        python = spec["executable"]
        os.execve(python, [python, "-I", "-B", "main.py"], env)
    except BaseException as e:
        os.write(failed_w, f"starting the program: {type(e).__name__}: {e}".encode()[:2000])
    os._exit(127)


def _init(spec, program, status, uid, gid):
    """G: PID 1 of the sandbox."""
    # PID 1 gets only the signals it handles; Python handles SIGINT, which the program could send.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    os.umask(0o022)
    root = os.getcwd()
    _check("sethostname", libc.sethostname(b"sandbox", 7))
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _build_root(root, spec, uid, gid)
    _mount_proc(root)
    _pivot(root)
    os.mkdir("/tmp/work", 0o700)
    with open("/tmp/work/main.py", "wb") as f:
        f.write(program)
    for path in ("/tmp/work", "/tmp/work/main.py"):
        os.chown(path, uid, gid)
    failed_r, failed_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _program(spec, uid, gid, failed_w)
    os.close(failed_w)
    failure = os.read(failed_r, 4096)
    while True:
        reaped, code, usage = os.wait4(-1, 0)
        if reaped == pid:
            break
    if failure:
        raise Refused(failure.decode(errors="replace"))
    cpu = round(usage.ru_utime + usage.ru_stime, 3)
    if os.WIFSIGNALED(code):
        _report(status, outcome="signaled", signal=os.WTERMSIG(code), cpu_s=cpu)
    else:
        _report(status, outcome="exited", code=os.WEXITSTATUS(code), cpu_s=cpu)
    os._exit(0)


def _confine(spec, program, status, uid, gid, ready_w, go_r, launcher):
    """C: new namespaces; waits for the launcher to map its ids, then starts G and waits."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != launcher:
        os._exit(1)
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    flags |= CLONE_NEWCGROUP | (CLONE_NEWNET if spec["limits"]["network"] == "deny" else 0)
    if libc.unshare(flags) != 0:
        raise Refused(
            f"cannot create namespaces ({os.strerror(ctypes.get_errno())}): this kernel or "
            "container forbids unprivileged user namespaces, so the program cannot be isolated"
        )
    os.write(ready_w, b"1")
    if os.read(go_r, 1) != b"1":
        os._exit(1)  # the launcher has reported why
    pid = os.fork()
    if pid == 0:
        _guarded(status, _init, spec, program, status, uid, gid)
    os.waitpid(pid, 0)
    os._exit(0)


def _write_maps(pid, uid, gid):
    if uid == 0:
        maps = [
            ("uid_map", f"0 0 1\n{NOBODY} {NOBODY} 1\n"),
            ("gid_map", f"0 0 1\n{NOBODY} {NOBODY} 1\n"),
        ]
    else:
        # Unprivileged: one line, our own id; setgroups must be denied before gid_map is written.
        maps = [
            ("uid_map", f"{uid} {uid} 1\n"),
            ("setgroups", "deny"),
            ("gid_map", f"{gid} {gid} 1\n"),
        ]
    for name, text in maps:
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(text)


def main():
    with open("spec.json") as f:
        spec = json.load(f)
    status = int(spec["status_fd"])
    os.set_inheritable(status, False)
    try:
        with open("main.py", "rb") as f:
            program = f.read()
        uid, gid = os.geteuid(), os.getegid()
        if uid == 0:
            uid = gid = NOBODY
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
    except OSError as e:
        _report(status, outcome="refused", reason=f"sandbox setup: {e}")
        return 1
    launcher = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(go_w)
        _guarded(status, _confine, spec, program, status, uid, gid, ready_w, go_r, launcher)
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) == b"1":
        try:
            _write_maps(pid, os.geteuid(), os.getegid())
            os.write(go_w, b"1")
        except OSError as e:
            _report(status, outcome="refused", reason=f"cannot map user ids: {e}")
    os.close(go_w)
    os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
