"""Starts an IPython kernel for the code-execution server (kernelspec corral-python3).

The kernel offers itself first to the OOM killer (oom_score_adj 1000), so code that exhausts
the sandbox's memory kills the kernel, which the server replaces, and not the server; and it
runs at the lowest CPU priority (SCHED_IDLE), so code that forks without end does not starve
the server either. debugpy
is kept out: importing it is half of ipykernel's start-up, and no client here debugs kernels.
"""
import os
import sys

try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
except OSError:
    pass
# The kernel, and what its code forks, yield the CPU to the server (SCHED_IDLE, else nice 19),
# within the sandbox's own CPU share: a fork bomb's hundreds of copies otherwise starve the
# server, which then never gets to interrupt or replace the kernel.
try:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
except (AttributeError, OSError):
    try:
        os.nice(19)
    except OSError:
        pass
sys.modules["debugpy"] = None  # import debugpy raises ImportError: ipykernel runs without it

from ipykernel import kernelapp  # noqa: E402

kernelapp.launch_new_instance()
