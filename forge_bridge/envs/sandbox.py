"""The sandbox a model's command runs in: bubblewrap (`bwrap`) namespaces around one process tree.

What the command sees (`sandbox="bwrap"`, the default):
- file system: `/usr` and the top-level links to it read-only, a short list of `/etc` files
  (no `passwd`, `shadow` or host names of the trainer's machine: a synthetic one-user
  `passwd`), `/proc` of its own PID namespace, a minimal `/dev`, a private size-capped `/tmp`
  (tmpfs), and the episode's working directory bound read-write at `/work`, the only place it
  can write. Nothing else exists inside: not the trainer's files, the store, the adapters, the
  user's home or `/root`.
- user: uid/gid 65534 inside, no capabilities, no further user namespaces. When the trainer
  runs as root, the sandbox is entered through `setpriv` as uid 65534 outside too, so the
  kernel counts the command's processes against `CommandLimits.processes` (root is exempt
  from RLIMIT_NPROC).
- network: a new, empty network namespace (its own loopback only) unless
  `CommandLimits.network` is set; PID, IPC, UTS and cgroup namespaces of its own.
- lifetime: `--die-with-parent` and a new PID namespace, so killing the sandbox on timeout
  takes every process it started with it; `--new-session` (no terminal injection).

Where bubblewrap is missing or the OS refuses the namespaces it needs, `require_sandbox`
raises `SandboxUnavailable` and nothing runs. `sandbox="none"` runs commands with only the
process limits, after a warning that says what is exposed; it is never chosen silently.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from forge_bridge.core.errors import InvalidArgument, SandboxUnavailable

SANDBOXES = ("bwrap", "none")
SANDBOX_WORKDIR = "/work"
"""Where the episode's working directory appears inside the sandbox."""
SANDBOX_UID = SANDBOX_GID = 65534
_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# /etc entries a command needs to run programs (alternatives: Debian's /usr/bin links point
# into it; ld.so: the dynamic linker's cache); nothing that describes the host's users or secrets.
_ETC = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf",
        "mime.types", "protocols", "services", "python3", "python3.11", "python3.12", "python3.13",
        "ssl", "ca-certificates")
_ETC_NETWORK = ("resolv.conf", "gai.conf")
_SYNTHETIC_ETC = {
    "passwd": f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
              f"sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:{SANDBOX_WORKDIR}:/bin/sh\n",
    "group": f"root:x:0:\nsandbox:x:{SANDBOX_GID}:\n",
    "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
}
UNSANDBOXED_EXPOSURE = (
    "commands run with the trainer's user and see its whole file system (its home, the run "
    "folder, the store, the adapters; anything that user can write, they can change), its "
    "processes, and the network unless unshare -n is permitted; only the time, CPU, memory, "
    "file-size and output limits apply")


@dataclass(frozen=True)
class Bind:
    """A host path seen inside the sandbox at `inside` (read-only unless `writable`)."""

    host: str
    inside: str
    writable: bool = False

    def __post_init__(self) -> None:
        for name in ("host", "inside"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.startswith("/"):
                raise InvalidArgument(f"Bind.{name}: expected an absolute path, got {value!r}")
        if self.inside == SANDBOX_WORKDIR or self.inside.startswith(SANDBOX_WORKDIR + "/") or self.inside == "/":
            raise InvalidArgument(f"Bind.inside: {self.inside!r} would hide or enter the working directory")
        if not os.path.exists(self.host):
            raise InvalidArgument(f"Bind.host: {self.host} does not exist")


def check_sandbox(sandbox: str) -> str:
    if sandbox not in SANDBOXES:
        raise InvalidArgument(f"sandbox: expected one of {SANDBOXES}, got {sandbox!r}")
    return sandbox


def require_sandbox(sandbox: str) -> None:
    """Raise `SandboxUnavailable` unless `sandbox` can run commands here; warn for "none"."""
    check_sandbox(sandbox)
    if sandbox == "none":
        warnings.warn(f"sandbox='none': {UNSANDBOXED_EXPOSURE}.", RuntimeWarning, stacklevel=3)
        return
    problem = bwrap_problem()
    if problem:
        raise SandboxUnavailable(
            f"cannot sandbox commands: {problem}. Install bubblewrap (Debian/Ubuntu: apt-get install "
            f"bubblewrap) on a kernel that allows user namespaces, or pass sandbox='none' to run them "
            f"unsandboxed ({UNSANDBOXED_EXPOSURE})")


@functools.lru_cache(maxsize=None)
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot run a command here, or None when it can (probed once)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed"
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        return "the trainer runs as root and util-linux's setpriv, needed to drop to an unprivileged user, is missing"
    with tempfile.TemporaryDirectory(prefix="forge-bwrap-probe-") as probe_dir:
        hand_over(Path(probe_dir), recursive=False)
        argv = [*privilege_drop_prefix(), *bwrap_argv(Path(probe_dir), network=False, tmp_mb=1), "true"]
        try:
            probe = subprocess.run(argv, capture_output=True, timeout=30, env=command_environment())
        except (OSError, subprocess.SubprocessError) as exc:
            return f"bwrap could not start ({exc})"
    if probe.returncode != 0:
        return f"bwrap failed (the OS may refuse user namespaces): {probe.stderr.decode(errors='replace').strip()}"
    return None


def privilege_drop_prefix() -> tuple[str, ...]:
    """As root, enter the sandbox as an unprivileged user (so RLIMIT_NPROC applies); else ()."""
    if os.geteuid() != 0:
        return ()
    return (shutil.which("setpriv") or "setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_GID}",
            "--clear-groups", "--")


def processes_allowed(processes: int) -> int:
    """The RLIMIT_NPROC value that lets the command start `processes` more processes.

    The kernel compares the limit with every process and thread of the (outside) user, so for a
    non-root trainer its own threads are counted in; as root the sandbox user starts near 0."""
    uid = SANDBOX_UID if os.geteuid() == 0 else os.geteuid()
    return processes + _tasks_of(uid)


def _tasks_of(uid: int) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid == uid:
                count += len(os.listdir(f"/proc/{entry.name}/task"))
        except OSError:  # the process ended while we looked
            continue
    return count


def check_reachable(workdir: Path, what: str = "working directory") -> None:
    """As root the sandbox is entered as uid 65534, which must be able to reach `workdir` to
    bind it: refuse clearly (before anything runs) when a parent folder is closed to others."""
    if os.geteuid() != 0:
        return
    for parent in workdir.parents:
        if not os.stat(parent).st_mode & 0o001:
            raise InvalidArgument(
                f"{what} {workdir}: the sandbox user (uid {SANDBOX_UID}) cannot reach it, {parent} "
                f"is closed to other users; keep it under a folder others may traverse "
                f"(the system's temporary folder is one; or chmod o+x {parent})")


def hand_over(path: Path, recursive: bool = True) -> None:
    """Give `path` (and, `recursive`, what is under it) to the sandbox user, so a command can
    change what the trainer wrote there. A no-op unless the trainer is root (otherwise both are
    the same user)."""
    if os.geteuid() != 0:
        return
    os.chown(path, SANDBOX_UID, SANDBOX_GID, follow_symlinks=False)
    if recursive and path.is_dir() and not path.is_symlink():
        for root, dirs, files in os.walk(path):
            for name in dirs + files:
                os.chown(os.path.join(root, name), SANDBOX_UID, SANDBOX_GID, follow_symlinks=False)


def command_environment(home: str = SANDBOX_WORKDIR, tmp: str = "/tmp") -> dict[str, str]:
    """Only what a command needs: no secrets or tokens inherited from the trainer's process."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": tmp, "USER": "sandbox",
            "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def bwrap_argv(workdir: Path, *, network: bool, tmp_mb: int, binds: Sequence[Bind] = ()) -> list[str]:
    """The `bwrap ... --` prefix that runs a command in `workdir`, bound at /work, with `binds`
    (host folders the command needs: a program's install, read-only; a socket's folder)."""
    argv = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr"]
    if network:
        argv.append("--share-net")
    for name in _TOP_LEVEL:
        host = Path("/") / name
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), str(host)]
    for name in _ETC + (_ETC_NETWORK if network else ()):
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    synthetic = _synthetic_etc()
    for name in _SYNTHETIC_ETC:
        argv += ["--ro-bind", str(synthetic / name), f"/etc/{name}"]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(tmp_mb * 1024 * 1024), "--tmpfs", "/tmp",
             "--bind", str(workdir), SANDBOX_WORKDIR]
    for bind in binds:
        argv += ["--bind" if bind.writable else "--ro-bind", str(bind.host), bind.inside]
    return argv + ["--remount-ro", "/", "--chdir", SANDBOX_WORKDIR, "--"]


@functools.lru_cache(maxsize=None)
def _synthetic_etc() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="forge-sandbox-etc-"))
    for name, text in _SYNTHETIC_ETC.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o644)
    folder.chmod(0o755)
    atexit.register(shutil.rmtree, folder, True)
    return folder


__all__ = ["SANDBOXES", "SANDBOX_WORKDIR", "Bind", "bwrap_argv", "bwrap_problem", "check_reachable", "hand_over",
           "require_sandbox"]
