"""The box a vetting child runs a learner's piece in: it ends with the kernel, takes
everything it started along, writes only small files in its scratch folder, and cannot
signal the kernel.

The child starts as one process and splits, before its imports, into two (`hold`):

* the keeper, which runs no learner code: it dies with the kernel (PR_SET_PDEATHSIG,
  and it also watches a pipe the kernel holds open, which closes when the kernel ends
  or lets the child go), ignores the signals a piece could send it, and on the way out
  ends every process the worker started (`_sweep`);
* the worker, which imports the engine and runs the pieces. It also dies with the
  keeper (PR_SET_PDEATHSIG). Where the system lets an unprivileged process make one, it
  is the first process of a PID namespace of its own: the system ends every process
  of the namespace when it ends, `setsid` or not, and the kernel's process id does not
  exist there. Elsewhere the keeper and the worker are "subreapers": a process the piece
  detaches is re-parented to them instead of to the system's first process, so the
  worker sees it and the keeper can end it.

`confine(scratch)` then bounds the worker's writes before the first piece runs: no file
larger than `FILE_LIMIT` (RLIMIT_FSIZE; the write fails with EFBIG), and on Linux 5.13
or later (Landlock) no write, removal or new file outside the scratch folder, numba's
cache folders and /dev/null; Landlock 6 or later also stops it from signalling any
process outside the box. `MECHANISMS` lists what ran.

What stays open without Landlock (an older kernel, macOS): the piece may write and
delete wherever the learner may (each file below `FILE_LIMIT`), and without a PID
namespace or Landlock it may find the kernel's process id (in /proc) and signal it.
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import sys

FILE_LIMIT = 64 << 20          # bytes one file the piece writes may reach
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
CLONE_NEWUSER, CLONE_NEWPID = 0x10000000, 0x20000000
LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF = 444, 445, 446
# Landlock's write rights by the ABI version that brought them: write, remove a folder or
# file, make a device, folder, file, socket, pipe, block device or link (1); rename or
# link across folders (2); truncate (3)
_WRITE_RIGHTS = {1: 0b1_1111_1111_0010, 2: 1 << 13, 3: 1 << 14}
_FILE_RIGHTS = (1 << 1) | (1 << 14)        # write, truncate: the rights a file rule may hold
_SCOPE_SIGNAL = 1 << 1                     # Landlock 6: no signal out of the box
MECHANISMS: list[str] = []                 # what isolated this process, for the kernel


def _libc():
    # the process's own symbols: find_library would start a process, and after unshare
    # the first process started is the namespace's first, whose end closes it
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    return _libc().prctl(option, value, 0, 0, 0) == 0


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent ends; end now if it already has."""
    if _prctl(PR_SET_PDEATHSIG, signal.SIGKILL) and not MECHANISMS:
        MECHANISMS.append("dies with its parent (PR_SET_PDEATHSIG)")
    if os.getppid() != parent:
        os._exit(0)


def _new_pid_namespace() -> bool:
    """Whether the next child of this process starts a PID namespace of its own (an
    unprivileged user namespace holds it; this process's user id maps to itself)."""
    if not sys.platform.startswith("linux"):
        return False
    uid, gid = os.getuid(), os.getgid()
    if _libc().unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0:
        return False
    try:
        for name, text in (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny"),
                           ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError:
        pass
    return True


def hold(kernel: int, lifeline: int, progress: int) -> None:
    """Split this process into the keeper (which never returns) and the worker (which
    returns and runs the pieces): see the module's docstring. `lifeline` is the read end
    of a pipe the kernel keeps open while it needs the child; the worker says its process
    id, as the kernel sees it, on `progress` ("p" and the id on one line) first thing.

    With a PID namespace there is one more process between the two: the namespace's
    first, which only waits for the worker and tells the keeper how it ended. The worker
    is not the first itself, since the first process of a namespace ignores the signals
    it sends itself, so a piece would behave otherwise there than in the kernel."""
    if not hasattr(os, "fork"):
        return
    _die_with_parent(kernel)
    in_namespace = _new_pid_namespace()
    parent = os.getpid()
    told_r, told_w = os.pipe()
    child, wake = _fork_watched()
    if child:
        os.close(told_w)
        _keep(child, wake, lifeline=lifeline, told=told_r)
    os.close(lifeline)
    os.close(told_r)
    if in_namespace:
        _die_with_parent(0)
        MECHANISMS.append("its own PID namespace (unshare)")
        parent = 1
        worker, wake = _fork_watched()
        if worker:
            _keep(worker, wake, tell=told_w)
    os.close(told_w)
    _die_with_parent(parent)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        me = os.readlink("/proc/self")        # the id the kernel sees, namespace or not
    except OSError:
        me = str(os.getpid())
    os.write(progress, b"p" + me.encode() + b"\n")


def _fork_watched() -> tuple[int, int]:
    """fork(); in the parent (the child's id, a descriptor readable when a child ends),
    in the child (0, -1) with the signals as they were."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    old = signal.set_wakeup_fd(wake_w)
    handler = signal.signal(signal.SIGCHLD, lambda *_: None)
    if _prctl(PR_SET_CHILD_SUBREAPER, 1):
        MECHANISMS.append("keeps the processes it starts (PR_SET_CHILD_SUBREAPER)")
    child = os.fork()
    if child:
        return child, wake_r
    signal.set_wakeup_fd(old)
    signal.signal(signal.SIGCHLD, handler)
    os.close(wake_r)
    os.close(wake_w)
    return 0, -1


def _keep(child: int, wake: int, lifeline: int = -1, told: int = -1, tell: int = -1):
    """Wait for `child` and end as it ended, after ending whatever is left below this
    process; also end when `lifeline` closes (the kernel ended, or let the child go).
    `tell`: write the child's wait status there instead of ending as it did (the first
    process of a namespace cannot signal itself); `told`: where such a status comes."""
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                   signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE, signal.SIGTSTP):
        signal.signal(number, signal.SIG_IGN)
    watched = [fd for fd in (lifeline, wake) if fd >= 0]
    status = None
    while status is None:
        readable = select.select(watched, [], [])[0]
        if lifeline in readable and not os.read(lifeline, 64):
            break
        if wake in readable:
            os.read(wake, 4096)
        status = _reap(child)
    if tell >= 0 and status is not None:
        os.write(tell, b"%d" % status)
        os._exit(0)
    if told >= 0 and status is not None:
        os.set_blocking(told, False)
        try:
            status = int(os.read(told, 64) or status)
        except (OSError, ValueError):
            pass
    _sweep()
    if status is None or os.WIFSIGNALED(status):
        number = os.WTERMSIG(status) if status is not None else signal.SIGKILL
        try:
            signal.signal(number, signal.SIG_DFL)
        except (OSError, ValueError):          # SIGKILL and SIGSTOP keep theirs
            pass
        os.kill(os.getpid(), number)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _reap(worker: int):
    """The worker's wait status once it has ended (else None); other ended children
    (processes the piece detached, re-parented here) are reaped on the way."""
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == worker:
            found = status


def _children_of() -> dict[int, list[int]]:
    """Parent process id -> its children, for every process /proc shows."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parent = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            tree.setdefault(parent, []).append(int(entry))
    return tree


def descendants(root: int) -> list[int]:
    """Every process below `root` (Linux /proc; empty elsewhere)."""
    if not os.path.isdir("/proc"):
        return []
    tree, found, todo = _children_of(), [], [root]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _sweep() -> None:
    """SIGKILL every process below this one, again until none is left (one may fork
    while the others end), and reap them."""
    for _ in range(50):
        left = descendants(os.getpid())
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap(-1)


def children_left() -> list[int]:
    """This process's children that still run (ended ones are reaped first): what a
    piece started and left behind, detached or not."""
    _reap(-1)
    pids = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
    except OSError:
        return []
    return pids


def threads_now() -> int:
    """The threads of this process that run Python, whether the threading module lists
    them or not (one removed from `threading._active` counts). The operating system's
    count (/proc/self/task) is not used: numba's OpenMP pool starts its threads at the
    first parallel loop, and the engine's own kernels are parallel."""
    return len(sys._current_frames())


def start_numba_threads() -> None:
    """Start numba's pool of threads now (once per process), so that a piece's first
    parallel loop is not taken for a thread it left running."""
    try:
        from numba.np.ufunc.parallel import _launch_threads
        _launch_threads()
    except Exception:   # noqa: BLE001  (no threading layer: no piece can start one)
        pass


def _landlock(allowed: list[str]) -> bool:
    """Forbid this process (and what it starts) every write outside `allowed` (folders,
    and files that get write rights only) and, Landlock 6 on, signals out of the box."""
    if not sys.platform.startswith("linux"):
        return False
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    if abi < 1:
        return False
    handled = sum(bits for version, bits in _WRITE_RIGHTS.items() if version <= abi)
    scoped = _SCOPE_SIGNAL if abi >= 6 else 0
    fields = (ctypes.c_uint64 * 3)(handled, 0, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(LANDLOCK_CREATE_RULESET, ctypes.byref(fields), ctypes.c_size_t(size),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        return False

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]
    try:
        for path in allowed:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            rights = handled if os.path.isdir(path) else handled & _FILE_RIGHTS
            rule = PathBeneath(rights, fd)
            libc.syscall(LANDLOCK_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0)
            os.close(fd)
        if not _prctl(PR_SET_NO_NEW_PRIVS, 1) or \
                libc.syscall(LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            return False
    finally:
        os.close(ruleset)
    MECHANISMS.append(f"writes only in its scratch folder (Landlock {abi})")
    if scoped:
        MECHANISMS.append("signals nothing outside it (Landlock scope)")
    return True


def confine(scratch: str, root: str) -> None:
    """Bound the worker's writes (see the module's docstring). `root`: the repository,
    whose __pycache__ folders numba keeps compiled code in."""
    try:
        import resource
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)     # a write past the bound: EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
        MECHANISMS.append(f"no file over {FILE_LIMIT >> 20} MB (RLIMIT_FSIZE)")
    except (ImportError, ValueError, OSError):
        pass
    caches = [os.path.join(folder, name) for top in ("engine", "coursework")
              for folder, names, _ in os.walk(os.path.join(root, top))
              for name in names if name == "__pycache__"]
    numba_cache = os.environ.get("NUMBA_CACHE_DIR")
    _landlock([scratch, os.devnull, *caches, *([numba_cache] if numba_cache else [])])
