#!/usr/bin/python3
"""Corral's code-execution server: runs code in Jupyter kernels inside the sandbox.

It listens on 127.0.0.1:49999 and speaks the protocol of E2B's code interpreter, which E2B's
`@e2b/code-interpreter` SDK and Corral's own API (`POST /v1/sandboxes/{id}/code`) both use:

  POST   /execute               {"code", "context_id"?, "language"?, "env_vars"?, "timeout"?}
                                -> NDJSON: stdout, stderr, result, error, number_of_executions,
                                   end_of_execution (always last)
  POST   /contexts              {"language"?, "cwd"?} -> {"id", "language", "cwd"}
  GET    /contexts              -> [{"id", "language", "cwd"}]
  DELETE /contexts/{id}         -> 204
  POST   /contexts/{id}/restart -> 204
  GET    /health                -> 200 {"status": "ok", "default_context": "ready"|"starting"}
  GET    /ready?wait=S          -> 200 once the default context's kernel answers (waiting up to S
                                   seconds for it), 503 while it starts, 500 if it could not
                                   (the recipe's readiness check: a warm pool's sandbox is ready
                                   once it passes)

Each context is a kernel of its own. The default context ("default") starts with the server
(with the sandbox), so a first execution finds it ready or nearly. Executions in one context run one
at a time, in order. A timeout (the request's, or the client going away) interrupts the kernel
and keeps its state; a kernel that does not stop within a few seconds, or dies (out of memory),
is replaced by a new one and the execution ends with an error saying so. Output beyond a bound
is dropped with a marker. Standard library and jupyter_client only (imported once the server listens): the recipe
installs Debian's python3-jupyter-client and python3-ipykernel; kernel.py starts the kernels.
"""

import json
import os
import queue
import select
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

HERE = os.path.dirname(os.path.abspath(__file__))
PORT = int(os.environ.get("CORRAL_CODE_PORT", "49999"))
HOST = os.environ.get("CORRAL_CODE_HOST", "127.0.0.1")
# Bounds on what one execution returns: stdout and stderr together, and each rich result.
MAX_OUTPUT = int(os.environ.get("CORRAL_CODE_MAX_OUTPUT", str(1 << 20)))
MAX_RESULT = int(os.environ.get("CORRAL_CODE_MAX_RESULT", str(16 << 20)))
MAX_RESULTS = 200
# How long an interrupted kernel has to stop before it is replaced.
INTERRUPT_GRACE = float(os.environ.get("CORRAL_CODE_INTERRUPT_GRACE", "3"))
# How often the strays of an interrupted kernel are swept again until it stops.
STRAY_SWEEP = 0.25
MAX_BODY = 16 << 20
# How long a readiness check may wait for the default kernel (GET /ready?wait=S).
MAX_READY_WAIT = 30.0
# How long a run waits for the kernel to reap the processes a stop killed.
REAP_WAIT = 5.0
KERNEL_NAME = "corral-python3"
LANGUAGES = ("python", "python3")
DEFAULT_CWD = os.environ.get("CORRAL_CODE_CWD") or os.environ.get("HOME") or "/root"

# Jupyter MIME types and the E2B result fields they fill.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


def log(*args):
    print("code-server:", *args, file=sys.stderr, flush=True)


def oom_kills():
    """The sandbox cgroup's count of processes killed for lack of memory (cgroup v2, or v1's
    memory controller), or None."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if k == "oom_kill":
                        return int(v)
        except (OSError, ValueError):
            pass
    return None


class ClientGone(Exception):
    """The HTTP client closed its connection."""


class Context:
    """One kernel and the executions that run in it, one at a time (lock)."""

    def __init__(self, ctx_id, language, cwd):
        self.id = ctx_id
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()  # held by the execution running in this context
        self.ready = threading.Event()
        self.start_error = None
        self.km = None
        self.kc = None
        # Counts stops: a kernel whose start began before a stop (a context removed or
        # restarted while its kernel was still starting) is shut down, not kept.
        self.generation = 0
        self.mu = threading.Lock()  # protects generation, km and kc against a start and a stop
        # The kernel's children that stop_strays killed, (pid, start time) pairs, for the
        # kernel to reap (reap_killed). Protected by lock.
        self.killed = []

    def describe(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def start(self, generation=None):
        """Starts the kernel and waits until it answers (protected by lock or before use). A
        start in the background is given the generation it was started for."""
        if generation is None:
            generation = self.generation
        try:
            # Imported here, in the thread that starts the first kernel, after the server listens.
            from jupyter_client.manager import KernelManager
            km = KernelManager(kernel_name=KERNEL_NAME)
            km.start_kernel(cwd=self.cwd)
            kc = km.client()
            kc.start_channels()
            kc.wait_for_ready(timeout=60)
            with self.mu:
                current = generation == self.generation
                if current:
                    self.km, self.kc = km, kc
                    self.start_error = None
            if not current:
                # Stopped while it started: nothing may use it, and nothing else would end it.
                Context.end(km, kc)
        except Exception as e:  # reported to the executions that wait for it
            log("start the kernel: %s" % e)
            if generation == self.generation:
                self.start_error = "start the kernel: %s" % e
        finally:
            if generation == self.generation:  # else the start after the stop sets it
                self.ready.set()

    def stop(self):
        """Ends the kernel and every process of its group. The group is killed first, with one
        system call (which a process forking meanwhile cannot escape): a fork bomb whose kernel
        died (the OOM killer takes the kernel first) forks on, and under it jupyter_client's
        shutdown, many steps of Python, could take minutes to get to its own kill."""
        with self.mu:
            self.generation += 1
            km, kc = self.km, self.kc
            self.km = self.kc = None
        self.killed = []  # the kernel's end hands them to the sandbox's init, which reaps them
        Context.end(km, kc)

    @staticmethod
    def end(km, kc):
        """Kills kernel km's process group, then lets jupyter_client clean up after it."""
        try:
            os.killpg(km.provisioner.pgid, signal.SIGKILL)
        except Exception:
            pass
        if kc is not None:
            try:
                kc.stop_channels()
            except Exception:
                pass
        if km is not None:
            try:
                km.shutdown_kernel(now=True)
            except Exception:
                pass

    def restart(self, background=False):
        """Replaces the kernel with a new one: every variable is gone. In the background, the
        old kernel is gone on return and executions wait for the new one (ready)."""
        self.ready.clear()
        self.stop()
        if background:
            threading.Thread(target=self.start, args=(self.generation,), daemon=True).start()
        else:
            self.start()

    def exit_signal(self):
        """The signal that ended the kernel's process, or 0."""
        try:
            code = self.km.provisioner.process.poll()
        except Exception:
            return 0
        return -code if code is not None and code < 0 else 0

    def alive(self):
        """Whether the kernel's process runs (Popen.poll: a system call, where jupyter_client's
        is_alive runs an event loop, slow when a fork bomb starves this server of CPU)."""
        try:
            return self.km.provisioner.process.poll() is None
        except Exception:
            return self.km is not None and self.km.is_alive()

    def stop_strays(self, interrupt=False):
        """Kills the processes the kernel's code forked into its process group (they would
        outlive an interrupted run, each a copy of the kernel), leaving the kernel; with
        interrupt, then interrupts the code (SIGINT to the kernel's main thread). Returns how
        many were killed; those that were the kernel's own children are added to killed, for
        reap_killed (the others' parents are killed too, and the sandbox's init reaps them).

        The group is stopped first (SIGSTOP to the group, which Linux gives to children forked
        while it is sent too), so no member forks while they are found and killed. Without that,
        a fork bomb outlives its interruption: a signal to the group reaches only the copies that
        exist when it is sent, the copies forked after it fork on, and they keep the sandbox's
        pids and memory exhausted, so that this server, starved of both, no longer gets to
        replace the kernel. The SIGINT is sent while the kernel is stopped, so the code forks
        nothing more, and to its main thread (tgkill): Python raises KeyboardInterrupt in the
        main thread only, and a signal for the whole process, sent while its threads are stopped
        or waking, may be taken by another of the kernel's threads, leaving the code running."""
        try:
            pid = self.km.provisioner.pid
            pgid = os.getpgid(pid)
            os.killpg(pgid, signal.SIGSTOP)
        except Exception:
            if interrupt:
                self.interrupt()
            return 0
        killed = set()
        sent = False
        try:
            for _ in range(20):  # again, for children whose fork was under way
                found = False
                for d in os.listdir("/proc"):
                    if not d.isdigit() or int(d) == pid or int(d) in killed:
                        continue
                    try:
                        with open("/proc/%s/stat" % d) as f:
                            fields = f.read().rsplit(")", 1)[1].split()
                        if int(fields[2]) == pgid and fields[0] != "Z":  # pgrp; zombies are dead
                            os.kill(int(d), signal.SIGKILL)
                            killed.add(int(d))
                            found = True
                            if int(fields[1]) == pid:  # ppid
                                self.killed.append((int(d), int(fields[19])))  # start time
                    except (OSError, IndexError, ValueError):
                        pass
                if not found:
                    break
            if interrupt:
                sent = tgkill(pid, pid, signal.SIGINT)
        finally:
            try:
                os.killpg(pgid, signal.SIGCONT)
            except OSError:
                pass
        if interrupt and not sent:
            self.interrupt()
        return len(killed)

    def reap_killed(self, kc):
        """Has the kernel reap its children that stop_strays killed, with a silent execution of
        kernel.py's reap, and waits (up to REAP_WAIT) until it did. Only the kernel can reap
        them, and only it may wait for its children: the server tells it which, so it waits for
        no child of the code's own (a subprocess whose exit status the code waits for). Left
        zombies, they would hold the kernel's processes (RLIMIT_NPROC) until it ends: after a
        fork bomb, all of them. Returns how many were reaped, or None where it is not known."""
        killed, self.killed = self.killed, []
        if not killed:
            return 0
        # A user expression: its value (the count) comes back in the reply.
        reap = "__import__('_corral_kernel').reap(%r)" % (killed,)
        try:
            msg_id = kc.execute("pass", silent=True, store_history=False, allow_stdin=False,
                                user_expressions={"n": reap})
        except Exception as e:
            log("reap: %s" % e)
            return None
        deadline = time.monotonic() + REAP_WAIT
        while time.monotonic() < deadline:
            try:
                msg = kc.get_shell_msg(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                try:
                    return int(msg["content"]["user_expressions"]["n"]["data"]["text/plain"])
                except (KeyError, TypeError, ValueError):
                    return None
        log("reap: the kernel did not answer in %gs" % REAP_WAIT)
        return None

    def interrupt(self):
        """Interrupts the kernel as jupyter_client does (SIGINT to its process group)."""
        try:
            self.km.interrupt_kernel()
        except Exception as e:
            log("interrupt: %s" % e)


# tgkill's system call number by machine (the standard library has no tgkill).
SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine)


def tgkill(tgid, tid, sig):
    """Sends sig to thread tid of process tgid; False where it could not."""
    if SYS_TGKILL is None:
        return False
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(SYS_TGKILL, tgid, tid, sig) == 0
    except Exception:
        return False


class Contexts:
    """The contexts by ID (protected by mu)."""

    def __init__(self):
        self.mu = threading.Lock()
        self.by_id = {}

    def create(self, language, cwd, ctx_id=None, background=False):
        ctx = Context(ctx_id or uuid.uuid4().hex, language, cwd)
        with self.mu:
            self.by_id[ctx.id] = ctx
        if background:
            threading.Thread(target=ctx.start, args=(ctx.generation,), daemon=True).start()
        else:
            ctx.start()
        return ctx

    def get(self, ctx_id):
        with self.mu:
            return self.by_id.get(ctx_id)

    def default(self):
        with self.mu:
            ctx = self.by_id.get("default")
        if ctx is None:
            ctx = self.create("python", DEFAULT_CWD, "default")
        return ctx

    def remove(self, ctx_id):
        with self.mu:
            return self.by_id.pop(ctx_id, None)

    def list(self):
        with self.mu:
            return [c.describe() for c in self.by_id.values()]


CONTEXTS = Contexts()


def normalize_language(lang):
    if lang in (None, "") or lang in LANGUAGES:
        return "python"
    return None


class Execution:
    """One execution's output, bounded, written to the HTTP client as NDJSON lines."""

    def __init__(self, handler):
        self.h = handler
        self.output = 0
        self.truncated = False
        self.results = 0

    def send(self, ev):
        try:
            self.h.wfile.write(json.dumps(ev).encode() + b"\n")
            self.h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            raise ClientGone()

    def stream(self, name, text):
        if self.truncated:
            return
        n = len(text.encode("utf-8", "replace"))
        if self.output + n > MAX_OUTPUT:
            keep = max(0, MAX_OUTPUT - self.output)
            if keep:
                self.send({"type": name, "text": text[:keep], "timestamp": now_us()})
            self.truncated = True
            self.send({"type": "stderr", "timestamp": now_us(),
                       "text": "\n[output truncated: this execution printed more than %d bytes; the rest is dropped]\n" % MAX_OUTPUT})
            return
        self.output += n
        self.send({"type": name, "text": text, "timestamp": now_us()})

    def result(self, data, main):
        self.results += 1
        if self.results > MAX_RESULTS:
            if self.results == MAX_RESULTS + 1:
                self.send({"type": "stderr", "timestamp": now_us(),
                           "text": "[results truncated: more than %d in one execution]\n" % MAX_RESULTS})
            return
        ev = {"type": "result", "is_main_result": main}
        size = 0
        extra = {}
        for mime, value in data.items():
            field = MIME_FIELDS.get(mime)
            if field == "json":
                value = value  # kept as JSON
            elif not isinstance(value, str):
                value = json.dumps(value)
            size += len(json.dumps(value))
            if field:
                ev[field] = value
            elif len(extra) < 16:
                extra[mime] = value
        if extra:
            ev["extra"] = extra
        if size > MAX_RESULT:
            ev = {"type": "result", "is_main_result": main,
                  "text": "[result dropped: %d bytes, more than the %d allowed]" % (size, MAX_RESULT)}
        self.send(ev)


def now_us():
    return int(time.time() * 1e6)


def client_gone(sock):
    """Whether the peer of sock has closed the connection (it sends nothing after the body)."""
    try:
        r, _, _ = select.select([sock], [], [], 0)
        if not r:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def run(ctx, code, out, timeout, env_vars, sock):
    """Runs code in ctx (its lock held), writing events to out. Returns nothing; the caller
    writes end_of_execution."""
    if not ctx.ready.wait(timeout=150):
        out.send({"type": "error", "name": "KernelNotReady", "value": "the kernel did not start in 150 s", "traceback": ""})
        return
    if ctx.kc is None or not ctx.alive():
        # A kernel that died between executions (or never started) is replaced first.
        log("context %s: kernel not running, starting a new one" % ctx.id)
        ctx.restart()
        if ctx.kc is None:
            out.send({"type": "error", "name": "KernelError", "value": ctx.start_error or "no kernel", "traceback": ""})
            return
    kc = ctx.kc
    drain(kc)
    if env_vars:
        code = env_prelude(env_vars) + code
    oom_before = oom_kills()
    # Never stop_on_error: after an error (a KeyboardInterrupt from a timeout, too) ipykernel then
    # aborts every execute request it receives for a short while, and the next run, sent as soon
    # as this one is idle, came back empty (status "aborted", no output, no error). Runs of a
    # context are one at a time (its lock), so there is never a queued one to abort.
    msg_id = kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=False)
    deadline = time.monotonic() + timeout if timeout and timeout > 0 else None
    interrupted_at = swept_at = None
    gone = False
    timed_out = False
    checked = 0.0
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=0.05)
        except queue.Empty:
            msg = None
        now = time.monotonic()
        if msg is None or now - checked > 0.1:
            # Checked when the kernel is quiet, and every 0.1 s of a flood.
            checked = now
            if not ctx.alive():
                oom = oom_kills()
                sig = ctx.exit_signal()
                why = "the kernel died"
                if oom is not None and oom_before is not None and oom > oom_before:
                    why = "the kernel was killed for lack of memory (the sandbox's memory limit)"
                elif sig == signal.SIGKILL:
                    why = "the kernel was killed (SIGKILL: most likely for lack of memory, the sandbox's memory limit)"
                elif sig:
                    why = "the kernel died of signal %d" % sig
                log("context %s: %s; starting a new one" % (ctx.id, why))
                out_send(out, gone, {"type": "error", "name": "KernelDied", "traceback": "",
                                     "value": why + "; a new kernel is starting: the context's variables are gone"})
                ctx.restart(background=True)
                return
            if interrupted_at is None:
                if deadline is not None and now > deadline:
                    timed_out = True
                elif client_gone(sock):
                    gone = True
                if timed_out or gone:
                    log("context %s: %s, interrupting the kernel" % (ctx.id, "timeout" if timed_out else "client gone"))
                    interrupted_at = swept_at = now
                    n = ctx.stop_strays(interrupt=True)
                    if n:
                        log("context %s: killed %d processes the code forked" % (ctx.id, n))
                    if timed_out:
                        out_send(out, gone, {"type": "error", "name": "TimeoutError", "traceback": "",
                                             "value": "execution timed out after %gs: the kernel was interrupted (its variables are kept)" % timeout})
            elif now - interrupted_at > INTERRUPT_GRACE:
                log("context %s: the kernel did not stop; starting a new one" % ctx.id)
                out_send(out, gone, {"type": "error", "name": "KernelRestarted", "traceback": "",
                                     "value": "the kernel did not stop when interrupted and was replaced: the context's variables are gone"})
                ctx.restart(background=True)
                return
            elif now - swept_at > STRAY_SWEEP:
                # What the code forked between the interrupt and its KeyboardInterrupt (a fork
                # bomb's copies fork on): left running, they starve the kernel, which then does
                # not get to stop within the grace.
                swept_at = now
                ctx.stop_strays()
        if msg is None:
            continue
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        t = msg["msg_type"]
        c = msg["content"]
        try:
            if t == "status" and c.get("execution_state") == "idle":
                if interrupted_at is not None:
                    n = ctx.stop_strays()
                    if n:
                        log("context %s: killed %d processes the interrupted code left" % (ctx.id, n))
                    n = len(ctx.killed)
                    if n:
                        log("context %s: the kernel reaped %s of the %d children killed" % (ctx.id, ctx.reap_killed(kc), n))
                return
            if gone:
                continue
            if t == "stream":
                out.stream("stderr" if c.get("name") == "stderr" else "stdout", c.get("text", ""))
            elif t == "execute_input":
                out.send({"type": "number_of_executions", "execution_count": c.get("execution_count")})
            elif t == "execute_result":
                out.result(c.get("data", {}), True)
            elif t == "display_data":
                out.result(c.get("data", {}), False)
            elif t == "error":
                if interrupted_at is not None and c.get("ename") == "KeyboardInterrupt":
                    continue  # the timeout error said it
                out.send({"type": "error", "name": c.get("ename", ""), "value": c.get("evalue", ""),
                          "traceback": "\n".join(c.get("traceback", []))})
        except ClientGone:
            gone = True


def out_send(out, gone, ev):
    if gone:
        return
    try:
        out.send(ev)
    except ClientGone:
        pass


def drain(kc):
    """Drops replies and messages of earlier executions."""
    for get in (kc.get_shell_msg, kc.get_iopub_msg):
        while True:
            try:
                get(timeout=0)
            except queue.Empty:
                break


def env_prelude(env_vars):
    pairs = {str(k): str(v) for k, v in env_vars.items()}
    return "import os as __corral_os; __corral_os.environ.update(%r); del __corral_os\n" % pairs


class Handler(BaseHTTPRequestHandler):
    server_version = "corral-code/1"

    def log_message(self, fmt, *args):
        pass

    def reply(self, status, body=None):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def fail(self, status, msg):
        self.reply(status, {"message": msg})

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise ValueError("body larger than %d bytes" % MAX_BODY)
        raw = self.rfile.read(n) if n else b"{}"
        v = json.loads(raw or b"{}")
        if not isinstance(v, dict):
            raise ValueError("want a JSON object")
        return v

    def path_parts(self):
        return [p for p in self.path.split("?", 1)[0].split("/") if p]

    def do_GET(self):
        parts = self.path_parts()
        if parts == ["health"]:
            d = CONTEXTS.get("default")
            state = "ready" if d is not None and d.ready.is_set() and d.kc is not None else "starting"
            return self.reply(200, {"status": "ok", "default_context": state})
        if parts == ["ready"]:
            return self.ready()
        if parts == ["contexts"]:
            return self.reply(200, CONTEXTS.list())
        self.fail(404, "no route GET %s" % self.path)

    def ready(self):
        """GET /ready?wait=S: the readiness check (200 once the default context's kernel
        answers; 503 while it starts; 500 if it could not), waiting up to S seconds first."""
        try:
            wait = float(parse_qs(urlsplit(self.path).query).get("wait", ["0"])[0])
        except ValueError:
            return self.fail(400, "wait: want seconds")
        d = CONTEXTS.get("default")
        if d is not None and wait > 0:
            d.ready.wait(min(wait, MAX_READY_WAIT))
        if d is not None and d.ready.is_set():
            if d.kc is not None:
                return self.reply(200, {"default_context": "ready"})
            if d.start_error:
                return self.fail(500, d.start_error)
        self.reply(503, {"default_context": "starting"})

    def do_DELETE(self):
        parts = self.path_parts()
        if len(parts) == 2 and parts[0] == "contexts":
            ctx = CONTEXTS.remove(parts[1])
            if ctx is None:
                return self.fail(404, "context %s not found" % parts[1])
            with ctx.lock:
                ctx.stop()
            return self.reply(204)
        self.fail(404, "no route DELETE %s" % self.path)

    def do_POST(self):
        parts = self.path_parts()
        try:
            req = self.body()
        except ValueError as e:
            return self.fail(400, "bad request body: %s" % e)
        if parts == ["execute"]:
            return self.execute(req)
        if parts == ["contexts"]:
            lang = normalize_language(req.get("language"))
            if lang is None:
                return self.fail(400, "language %r is not available here (python only)" % req.get("language"))
            cwd = req.get("cwd") or DEFAULT_CWD
            if not isinstance(cwd, str) or not os.path.isdir(cwd):
                return self.fail(400, "cwd %r is not a directory" % cwd)
            # The kernel starts in the background: the first execution in the context waits
            # for it (and reports it if it could not start).
            ctx = CONTEXTS.create(lang, cwd, background=True)
            return self.reply(200, ctx.describe())
        if len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
            ctx = CONTEXTS.get(parts[1])
            if ctx is None:
                return self.fail(404, "context %s not found" % parts[1])
            with ctx.lock:
                ctx.restart(background=True)
            return self.reply(204)
        self.fail(404, "no route POST %s" % self.path)

    def execute(self, req):
        code = req.get("code")
        if not isinstance(code, str):
            return self.fail(400, "code: want a string")
        ctx_id = req.get("context_id")
        lang = req.get("language")
        if ctx_id:
            ctx = CONTEXTS.get(ctx_id)
            if ctx is None:
                return self.fail(404, "context %s not found" % ctx_id)
        else:
            if normalize_language(lang) is None:
                return self.fail(400, "language %r is not available here (python only)" % lang)
            ctx = CONTEXTS.default()
        timeout = req.get("timeout") or 0
        if not isinstance(timeout, (int, float)) or timeout < 0:
            return self.fail(400, "timeout: want seconds, a positive number")
        env_vars = req.get("env_vars") or {}
        if not isinstance(env_vars, dict):
            return self.fail(400, "env_vars: want an object")
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        out = Execution(self)
        with ctx.lock:
            try:
                run(ctx, code, out, timeout, env_vars, self.connection)
                out.send({"type": "end_of_execution"})
            except ClientGone:
                pass


def main():
    os.environ.setdefault("JUPYTER_PATH", HERE)
    os.environ["JUPYTER_PATH"] = HERE
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    # The server listens first (Corral's create waits for the port: standard library only, so
    # that is quick), then the default context's kernel starts in the background, with the
    # sandbox: an execution that comes before it is ready waits for it.
    srv = ThreadingHTTPServer((HOST, PORT), Handler)
    srv.daemon_threads = True
    CONTEXTS.create("python", DEFAULT_CWD, "default", background=True)
    log("listening on %s:%d" % (HOST, PORT))
    srv.serve_forever()


if __name__ == "__main__":
    main()
