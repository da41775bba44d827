"""Starts an IPython kernel for the code-execution server (kernelspec corral-python3).

The kernel offers itself first to the OOM killer (oom_score_adj 1000), so code that exhausts
the sandbox's memory kills the kernel, which the server replaces, and not the server. debugpy
is kept out: importing it is half of ipykernel's start-up, and no client here debugs kernels.
"""
import sys

try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
except OSError:
    pass
sys.modules["debugpy"] = None  # import debugpy raises ImportError: ipykernel runs without it

from ipykernel import kernelapp  # noqa: E402

kernelapp.launch_new_instance()
