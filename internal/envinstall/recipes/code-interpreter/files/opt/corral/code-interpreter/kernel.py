"""Starts an IPython kernel for the code-execution server (kernelspec corral-python3).

The kernel offers itself first to the OOM killer (oom_score_adj 1000), so code that exhausts
the sandbox's memory kills the kernel, which the server replaces, and not the server. It also
leaves the server room for its threads: the kernel and everything its code forks may hold all
but a reserve of the sandbox's processes (RLIMIT_NPROC, see nproc_cap), so a fork bomb fails its
forks before the server, the agent or a command the user runs beside it cannot start a thread.
debugpy is kept out: importing it is half of ipykernel's start-up, and no client here debugs
kernels.
"""
import resource
import sys


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

from ipykernel import kernelapp  # noqa: E402

kernelapp.launch_new_instance()
