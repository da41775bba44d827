"""Starts an IPython kernel for the code-execution server (kernelspec corral-python3).

The kernel offers itself first to the OOM killer (oom_score_adj 1000), so code that exhausts
the sandbox's memory kills the kernel, which the server replaces, and not the server. It also
leaves the server room for its threads: the kernel and everything its code forks may hold all
but a reserve of the sandbox's processes (RLIMIT_NPROC, see nproc_cap), so a fork bomb fails its
forks before the server, the agent or a command the user runs beside it cannot start a thread.
debugpy is kept out: importing it is half of ipykernel's start-up, and no client here debugs
kernels.

The kernel reaps the processes of its code that the server killed (reap, which the server calls
with a silent execution after it stopped a run's strays): each is a child of the kernel, and
left a zombie it would hold one of the kernel's processes (RLIMIT_NPROC) until the kernel ends.
Only those, and of those not the code's pending subprocesses (a Popen that has not collected its
child's status): the kernel installs no SIGCHLD handler and never waits for any other child, so
the code's own subprocess.run, Popen.wait and os.wait get their children's exit statuses.

An interrupt that Python drops is sent again (Reinterrupt): a KeyboardInterrupt raised inside an
os.fork hook (logging's lock, released after every fork) is printed as "Exception ignored" and
lost, and a fork bomb spends nearly all its time in os.fork, so without this its interrupt was
lost and the kernel replaced.
"""
import gc
import os
import resource
import signal
import sys
import threading
import time


# What one more process of the kernel's costs the sandbox's memory: a copy of a kernel
# (page tables, its stack, the pages it writes) measured 1.7 MB each for 200 copies of an idle
# one; 3 MiB leaves room for a kernel with more loaded.
PROCESS_BYTES = 3 << 20


def mem_total():
    """The sandbox's memory in bytes (Corral's /proc/meminfo shows its limit), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def nproc_cap(limit, memory):
    """The kernel's RLIMIT_NPROC, given the sandbox's and its memory, or None to keep it.

    Corral gives a sandbox in a user namespace RLIMIT_NPROC at twice its pids.max, counted for
    the sandbox's root, the user everything here runs as. The kernel's limit is the lower of
    that pids.max less a reserve (an eighth, 16 to 128 processes) for the server and the rest
    of the sandbox, and as many processes as half the sandbox's memory holds (PROCESS_BYTES
    each, at least 64): a fork bomb then runs out of processes before the sandbox runs out of
    memory, which would leave the server starved in reclaim, unable to stop it. Without a
    finite limit (no user namespace: root's count is the host's) nothing changes."""
    if limit == resource.RLIM_INFINITY or limit <= 0:
        return None
    pids = limit // 2
    reserve = min(128, max(16, pids // 8))
    cap = max(16, pids - reserve)
    if memory:
        cap = min(cap, max(64, memory // 2 // PROCESS_BYTES))
    return cap


def child_stat(pid):
    """The parent's pid and the start time (clock ticks after boot) of process pid, or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def pending_pids():
    """The pids of the code's subprocess.Popen and multiprocessing children whose exit status
    it has not collected yet: their owners wait for them (or reap them when collected)."""
    kinds = []
    for mod, name in (("subprocess", "Popen"), ("multiprocessing.popen_fork", "Popen")):
        m = sys.modules.get(mod)
        if m is not None and hasattr(m, name):
            kinds.append(getattr(m, name))
    if not kinds:
        return set()
    kinds = tuple(kinds)
    return {o.pid for o in gc.get_objects() if isinstance(o, kinds) and getattr(o, "returncode", 0) is None}


def reap(children, wait=2.0):
    """Reaps the kernel's children the server killed, given as (pid, start time) pairs, waiting
    up to wait seconds for each to end (SIGKILL takes effect at once, but not in the same
    instant). A pid is waited for only while it is still this kernel's child with that start
    time and no Popen of the code's owns it: one the code reaped itself, a pid reused since,
    and a subprocess whose status the code will ask for are left alone. Returns how many were
    reaped."""
    me = os.getpid()
    deadline = time.monotonic() + wait
    pending = pending_pids()
    left, reaped = [tuple(c) for c in children if c[0] not in pending], 0
    while left:
        keep = []
        for pid, start in left:
            if child_stat(pid) != (me, start):
                continue
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # the code reaped it between the check and the wait
                continue
            if done:
                reaped += 1
            else:
                keep.append((pid, start))
        left = keep
        if left and time.monotonic() < deadline:
            time.sleep(0.01)
        else:
            break
    return reaped


class Reinterrupt:
    """Sends SIGINT again to the main thread whenever Python drops a KeyboardInterrupt as
    unraisable (an os.fork hook, a finalizer): the interrupt then lands where the code runs.
    The signal is sent by a thread of its own, started with the kernel (a fork bomb leaves no
    process for a new one), once the hook has returned: sent from the hook, it would be raised in
    the hook again. Other unraisable exceptions go to the previous hook."""

    def __init__(self):
        self.lost = threading.Event()
        self.main = threading.main_thread().ident
        self.previous = sys.unraisablehook
        threading.Thread(target=self.run, name="corral-reinterrupt", daemon=True).start()
        sys.unraisablehook = self.hook

    def hook(self, unraisable):
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            self.lost.set()
            return
        self.previous(unraisable)

    def run(self):
        while True:
            self.lost.wait()
            self.lost.clear()
            try:
                signal.pthread_kill(self.main, signal.SIGINT)
            except OSError:
                return


# The server's silent execution imports this module by this name: the kernel's __main__ becomes
# the user's namespace.
sys.modules["_corral_kernel"] = sys.modules[__name__]

try:
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    cap = nproc_cap(soft, mem_total())
    if cap is not None and cap < soft:
        resource.setrlimit(resource.RLIMIT_NPROC, (cap, cap))
except (OSError, ValueError):
    pass

try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
except OSError:
    pass
sys.modules["debugpy"] = None  # import debugpy raises ImportError: ipykernel runs without it
Reinterrupt()

from ipykernel import kernelapp  # noqa: E402

kernelapp.launch_new_instance()
