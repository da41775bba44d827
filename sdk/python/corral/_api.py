"""The routes of the Corral API as :class:`~corral._core.Call` builders.

Both clients call these: each function returns the request to send and the parser of its
answer, so a route is described once whatever transport sends it.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Dict, Mapping, Optional, Sequence

from . import models as m
from ._core import (Call, Request, b64e, duration, env_list, esc, into, network_json,
                    parse_json, parse_ndjson, project_path, raw_body, sandbox_path, size)


def _drop_empty(d: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in d.items() if v not in (None, "", [], {}, 0)}


# ---- server ----

def health() -> Call:
    return Call(Request("GET", "/healthz", auth=False))


def info() -> Call:
    return Call(Request("GET", "/v1/info"), into(m.ServerInfo))


def metrics() -> Call:
    return Call(Request("GET", "/v1/metrics"), lambda s, h, b: b.decode("utf-8", "replace"))


# ---- sandboxes ----

def create_body(base: str = "", workspace: str = "", toolkits: Optional[Sequence[str]] = None,
                env: Any = None, ttl: Any = None, labels: Optional[Mapping[str, str]] = None,
                memory: Any = None, cpus: Optional[float] = None, network: Any = None,
                tier: str = "", runtime: str = "", environment: str = "", disk: Any = None,
                pids: Optional[int] = None, idle_ttl: Any = None, hostname: str = "",
                from_snapshot: str = "", auto_pause_after: Any = None,
                pause_keeps_ttl: Optional[bool] = None, project: str = "",
                node_selector: Optional[Mapping[str, str]] = None, fetch: str = "",
                image: str = "", open_files: Optional[int] = None,
                output_bytes: Any = None, volumes: Any = None) -> Dict[str, Any]:
    limits = _drop_empty({"cpus": cpus, "memory_bytes": size(memory), "disk_bytes": size(disk),
                          "pids": pids, "open_files": open_files,
                          "output_bytes": size(output_bytes)})
    body = _drop_empty({
        "base": base, "workspace": workspace, "toolkits": list(toolkits or []),
        "env": env_list(env), "ttl": duration(ttl), "labels": dict(labels or {}),
        "tier": tier, "runtime": runtime, "environment": environment, "limits": limits,
        "idle_ttl": duration(idle_ttl), "hostname": hostname, "from_snapshot": from_snapshot,
        "auto_pause_after": duration(auto_pause_after), "project": project,
        "node_selector": dict(node_selector or {}), "fetch": fetch, "image": image,
        "network": network_json(network), "volumes": volume_mounts(volumes),
    })
    if pause_keeps_ttl is not None:
        body["pause_keeps_ttl"] = pause_keeps_ttl
    return body


def volume_mounts(volumes: Any) -> List[Dict[str, Any]]:
    """A create's volumes: "NAME:/path[:ro]" strings, (name, path[, read_only]) tuples, dicts
    or VolumeMount objects."""
    out: List[Dict[str, Any]] = []
    for v in volumes or []:
        if isinstance(v, str):
            name, _, rest = v.partition(":")
            path, ro = rest, False
            if rest.endswith(":ro") or rest.endswith(":rw"):
                path, ro = rest[:-3], rest.endswith(":ro")
            d: Dict[str, Any] = {"name": name, "path": path}
        elif isinstance(v, (tuple, list)):
            d, ro = {"name": v[0], "path": v[1]}, bool(v[2]) if len(v) > 2 else False
        elif isinstance(v, dict):
            d, ro = {"name": v["name"], "path": v["path"]}, bool(v.get("read_only"))
        else:
            d, ro = {"name": v.name, "path": v.path}, bool(v.read_only)
        if ro:
            d["read_only"] = True
        out.append(d)
    return out


def create(body: Dict[str, Any], idempotency_key: Optional[str]) -> Call:
    # Every create carries an idempotency key (a fresh one unless given), so that retrying it
    # after a lost answer returns the sandbox the first attempt made instead of making another.
    key = idempotency_key or "py-" + uuid.uuid4().hex
    req = Request("POST", "/v1/sandboxes", json_body=body, headers={"Idempotency-Key": key},
                  idempotent=True)
    return Call(req, into(m.SandboxInfo))


def get(id: str, wait_running: bool = False) -> Call:
    q = [("wait", "running")] if wait_running else []
    return Call(Request("GET", sandbox_path(id), query=q), into(m.SandboxInfo))


def list_sandboxes(labels: Optional[Mapping[str, str]], state: Any, project: str) -> Call:
    q = []
    states = [state] if isinstance(state, str) else list(state or [])
    q += [("state", s) for s in states]
    if project:
        q.append(("project", project))
    q += [("label", "%s=%s" % (k, v)) for k, v in sorted((labels or {}).items())]
    return Call(Request("GET", "/v1/sandboxes", query=q), into(m.SandboxInfo, "sandboxes"))


def delete(id: str) -> Call:
    return Call(Request("DELETE", sandbox_path(id)), into(m.SandboxInfo))


def set_ttl(id: str, ttl: Any) -> Call:
    return Call(Request("POST", sandbox_path(id, "ttl"), json_body={"ttl": duration(ttl)},
                        idempotent=True), into(m.SandboxInfo))


def pause(id: str) -> Call:
    return Call(Request("POST", sandbox_path(id, "pause"), idempotent=True), into(m.SandboxInfo))


def resume(id: str) -> Call:
    return Call(Request("POST", sandbox_path(id, "resume"), idempotent=True), into(m.SandboxInfo))


def fork(id: str, count: int, labels: Optional[Mapping[str, str]], disk_only: bool,
         ttl: Any) -> Call:
    body: Dict[str, Any] = {"count": count}
    body.update(_drop_empty({"labels": dict(labels or {}), "disk_only": disk_only,
                             "ttl": duration(ttl)}))
    return Call(Request("POST", sandbox_path(id, "fork"), json_body=body),
                into(m.SandboxInfo, "sandboxes"))


def snapshot(id: str, name: str, version: Optional[str], exclude: Optional[Sequence[str]]) -> Call:
    if version is None and ":" in name:
        name, version = name.split(":", 1)
    if not version:
        version = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    body = _drop_empty({"name": name, "version": version, "exclude": list(exclude or [])})
    return Call(Request("POST", sandbox_path(id, "snapshot"), json_body=body), into(m.Layer))


def set_network(id: str, policy: Any) -> Call:
    return Call(Request("PUT", sandbox_path(id, "network"), json_body=network_json(policy) or {}),
                into(m.SandboxInfo))


def blocked(id: str) -> Call:
    return Call(Request("GET", sandbox_path(id, "network", "blocked")), into(m.BlockedAttempt))


def _since(since: Any) -> str:
    """A since parameter: a datetime (RFC 3339), or a duration back from now ("10m", seconds)."""
    if since is None or since == "":
        return ""
    if hasattr(since, "isoformat"):
        if since.tzinfo is None:
            import datetime as _dt
            since = since.replace(tzinfo=_dt.timezone.utc)
        return since.isoformat()
    if isinstance(since, (int, float)):
        return "%ds" % int(since)
    return str(since)


def sandbox_metrics(id: str, since: Any) -> Call:
    s = _since(since)
    return Call(Request("GET", sandbox_path(id, "metrics"), query=[("since", s)] if s else []),
                lambda st, h, b: [m.MetricSample.from_json(x) for x in (parse_json(b).get("samples") or [])])


def events(project: str, since: Any, types: Optional[Sequence[str]], follow: bool) -> Request:
    q = []
    if project:
        q.append(("project", project))
    s = _since(since)
    if s:
        q.append(("since", s))
    if types:
        q.append(("type", ",".join(types)))
    if follow:
        q.append(("follow", "true"))
    return Request("GET", "/v1/events", query=q, stream=True)


def fetch_stats(id: str) -> Call:
    return Call(Request("GET", sandbox_path(id, "fetch")), lambda s, h, b: parse_json(b))


def trajectory(id: str, after: int) -> Call:
    q = [("after", str(after))] if after > 0 else []
    return Call(Request("GET", sandbox_path(id, "trajectory"), query=q),
                lambda s, h, b: [m.TrajectoryEntry.from_json(x) for x in parse_ndjson(b)])


# ---- vm sandboxes ----

def screenshot(id: str) -> Call:
    return Call(Request("GET", sandbox_path(id, "screen")), raw_body)


def input_events(id: str, events: Sequence[Mapping[str, Any]]) -> Call:
    return Call(Request("POST", sandbox_path(id, "input"), json_body={"events": list(events)}),
                lambda s, h, b: parse_json(b))


def power(id: str, action: str, force: bool) -> Call:
    body = {"action": action, "force": True} if force else {"action": action}
    return Call(Request("POST", sandbox_path(id, "power"), json_body=body), into(m.SandboxInfo))


def console(id: str, nbytes: int) -> Call:
    q = [("bytes", str(nbytes))] if nbytes > 0 else []
    return Call(Request("GET", sandbox_path(id, "console"), query=q), raw_body)


# ---- commands ----

def exec_body(argv: Any, env: Any = None, cwd: Optional[str] = None, user: Optional[str] = None,
              stdin: Any = None, timeout: Any = None, step_id: Optional[str] = None,
              exclusive: bool = False, shell: bool = False, open_stdin: bool = False,
              tty: bool = False, rows: int = 0, cols: int = 0) -> Dict[str, Any]:
    if isinstance(argv, str):
        argv, shell = [argv], True
    body: Dict[str, Any] = {"argv": list(argv)}
    body.update(_drop_empty({"env": env_list(env), "cwd": cwd, "user": user,
                             "timeout": duration(timeout), "step_id": step_id,
                             "rows": rows, "cols": cols}))
    if stdin:
        body["stdin"] = b64e(stdin)
    for k, v in (("shell", shell), ("open_stdin", open_stdin), ("tty", tty),
                 ("exclusive", exclusive)):
        if v:
            # Sent only when set: servers that predate a field refuse unknown ones.
            body[k] = True
    return body


def exec_stream(id: str, body: Dict[str, Any]) -> Request:
    # With a step_id the exec is safe to repeat: the server replays a finished step and
    # attaches to a running one.
    return Request("POST", sandbox_path(id, "exec"), json_body=body,
                   idempotent=bool(body.get("step_id")), stream=True)


def start_command(id: str, body: Dict[str, Any]) -> Call:
    return Call(Request("POST", sandbox_path(id, "commands"), json_body=body,
                        idempotent=bool(body.get("step_id"))), into(m.Command))


def commands(id: str) -> Call:
    return Call(Request("GET", sandbox_path(id, "commands")), into(m.Command, "commands"))


def command(id: str, cid: str) -> Call:
    return Call(Request("GET", sandbox_path(id, "commands", cid)), into(m.Command))


def attach(id: str, cid: str, offset: int, follow: bool) -> Request:
    return Request("GET", sandbox_path(id, "commands", cid, "output"),
                   query=[("offset", str(offset)), ("follow", "true" if follow else "false")],
                   stream=True)


def write_stdin(id: str, cid: str, data: Any, eof: bool) -> Call:
    if isinstance(data, str):
        data = data.encode()
    return Call(Request("POST", sandbox_path(id, "commands", cid, "stdin"),
                        query=[("eof", "true" if eof else "false")], body=bytes(data or b""),
                        content_type="application/octet-stream"))


def signal(id: str, cid: str, sig: Any) -> Call:
    return Call(Request("POST", sandbox_path(id, "commands", cid, "signal"),
                        json_body={"signal": str(int(sig)) if not isinstance(sig, str) else sig},
                        idempotent=True))


def resize(id: str, cid: str, rows: int, cols: int) -> Call:
    return Call(Request("POST", sandbox_path(id, "commands", cid, "resize"),
                        json_body={"rows": rows, "cols": cols}, idempotent=True))


# ---- files ----

def read_file(id: str, path: str) -> Call:
    return Call(Request("GET", sandbox_path(id, "files"), query=[("path", path)]), raw_body)


def write_file(id: str, path: str, data: Any, mode: Optional[int], user: Optional[str],
               parents: bool, append: bool) -> Call:
    if isinstance(data, str):
        data = data.encode()
    q = [("path", path)]
    if mode is not None:
        q.append(("mode", "0%o" % mode))
    if user:
        q.append(("user", user))
    if parents:
        q.append(("parents", "true"))
    if append:
        q.append(("append", "true"))
    req = Request("PUT", sandbox_path(id, "files"), query=q, body=bytes(data),
                  content_type="application/octet-stream")
    req.idempotent = not append
    return Call(req, into(m.FileInfo))


def stat(id: str, path: str) -> Call:
    return Call(Request("GET", sandbox_path(id, "files", "stat"), query=[("path", path)]),
                into(m.FileInfo))


def list_dir(id: str, path: str) -> Call:
    return Call(Request("GET", sandbox_path(id, "files", "list"), query=[("path", path)]),
                into(m.FileInfo, "files"))


def mkdir(id: str, path: str, mode: Optional[int], parents: bool, user: Optional[str]) -> Call:
    body = _drop_empty({"path": path, "mode": mode, "parents": parents, "user": user})
    return Call(Request("POST", sandbox_path(id, "files", "mkdir"), json_body=body,
                        idempotent=parents), into(m.FileInfo))


def remove(id: str, path: str, recursive: bool) -> Call:
    q = [("path", path)] + ([("recursive", "true")] if recursive else [])
    return Call(Request("DELETE", sandbox_path(id, "files"), query=q))


def move(id: str, source: str, destination: str) -> Call:
    return Call(Request("POST", sandbox_path(id, "files", "move"),
                        json_body={"source": source, "destination": destination}),
                into(m.FileInfo))


def watch(id: str, path: str, recursive: bool) -> Request:
    q = [("path", path)] + ([("recursive", "true")] if recursive else [])
    return Request("GET", sandbox_path(id, "files", "watch"), query=q, stream=True)


def tar_out(id: str, path: str) -> Request:
    return Request("GET", sandbox_path(id, "files", "tar"), query=[("path", path)], stream=True)


def tar_in(id: str, path: str, data: bytes) -> Call:
    return Call(Request("PUT", sandbox_path(id, "files", "tar"), query=[("path", path)],
                        body=data, content_type="application/x-tar"))


# ---- layers and environments ----

def import_layer(name: str, version: str, kind: str, data: bytes,
                 image_config: Optional[Mapping[str, Any]], below: Sequence[str], project: str,
                 private: bool) -> Call:
    q = [("name", name), ("version", version), ("kind", kind)]
    if image_config:
        q.append(("image_config", json.dumps(dict(image_config))))
    q += [("below", b) for b in below]
    if project:
        q.append(("project", project))
    if private:
        q.append(("private", "true"))
    # Publishing the same content under the same NAME:VERSION again is a no-op: safe to retry.
    return Call(Request("POST", "/v1/layers", query=q, body=data, content_type="application/x-tar",
                        idempotent=True), into(m.Layer))


def layers(name: str) -> Call:
    q = [("name", name)] if name else []
    return Call(Request("GET", "/v1/layers", query=q), into(m.Layer, "layers"))


def _layer_path(name: str, version: str) -> str:
    return "/v1/layers/%s/%s" % (esc(name), esc(version))


def layer(name: str, version: str) -> Call:
    return Call(Request("GET", _layer_path(name, version)), into(m.Layer))


def layer_stats(name: str, version: str, node: str) -> Call:
    q = [("node", node)] if node else []
    return Call(Request("GET", _layer_path(name, version) + "/stats", query=q),
                lambda s, h, b: parse_json(b))


def set_layer_fill_rate(name: str, version: str, rate: int) -> Call:
    return Call(Request("PATCH", _layer_path(name, version), json_body={"fill_rate": rate},
                        idempotent=True), into(m.Layer))


def delete_layer(name: str, version: str) -> Call:
    return Call(Request("DELETE", _layer_path(name, version)), into(m.Layer))


def tag_layer(name: str, tag: str, version: str) -> Call:
    return Call(Request("PUT", "/v1/layers/%s/tags/%s" % (esc(name), esc(tag)),
                        json_body={"version": version}), into(m.Layer))


def delete_tag(name: str, tag: str) -> Call:
    return Call(Request("DELETE", "/v1/layers/%s/tags/%s" % (esc(name), esc(tag))))


def gc_layers() -> Call:
    return Call(Request("POST", "/v1/layers/gc", idempotent=True), lambda s, h, b: parse_json(b))


def save_environment(name: str, base: str, workspace: str, toolkits: Sequence[str],
                     microvm_template: bool, warm: int = 0, runtime: str = "",
                     network: Optional[Dict[str, Any]] = None, tier: str = "") -> Call:
    body = _drop_empty({"name": name, "base": base, "workspace": workspace,
                        "toolkits": list(toolkits), "runtime": runtime, "tier": tier})
    if microvm_template:
        body["microvm_template"] = True
    if warm:
        body["warm"] = warm
    if network is not None:
        body["network"] = network
    return Call(Request("POST", "/v1/environments", json_body=body), into(m.Environment))


def update_environment(name: str, warm: int) -> Call:
    return Call(Request("PATCH", "/v1/environments/" + esc(name), json_body={"warm": warm}),
                into(m.Environment))


def environments() -> Call:
    return Call(Request("GET", "/v1/environments"), into(m.Environment))


def environment(name: str) -> Call:
    return Call(Request("GET", "/v1/environments/" + esc(name)), into(m.Environment))


def delete_environment(name: str) -> Call:
    return Call(Request("DELETE", "/v1/environments/" + esc(name)))


# ---- builds ----

def start_build(name: str, dockerfile: str, context_tar: bytes = b"",
                build_args: Sequence[str] = (), network: Any = None, runtime: str = "",
                project: str = "", no_cache: bool = False) -> Call:
    """POST /v1/builds: the JSON head, a newline, then the build context as a tar."""
    head = _drop_empty({"name": name, "dockerfile": dockerfile, "build_args": list(build_args),
                        "runtime": runtime, "project": project, "no_cache": no_cache})
    if network is not None:
        head["network"] = network_json(network)
    body = json.dumps(head).encode() + b"\n" + context_tar
    return Call(Request("POST", "/v1/builds", body=body, content_type="application/octet-stream"),
                into(m.Build))


def builds() -> Call:
    return Call(Request("GET", "/v1/builds"), into(m.Build))


def build(build_id: str) -> Call:
    return Call(Request("GET", "/v1/builds/" + esc(build_id)), into(m.Build))


def cancel_build(build_id: str) -> Call:
    return Call(Request("POST", "/v1/builds/%s/cancel" % esc(build_id)), into(m.Build))


def build_logs(build_id: str, follow: bool = False) -> Call:
    """The build's events (step, log, end) as dicts; with follow, until the build ends."""
    q = [("follow", "true")] if follow else []
    return Call(Request("GET", "/v1/builds/%s/logs" % esc(build_id), query=q),
                lambda s, h, b: parse_ndjson(b))


# ---- volumes ----

def _project_query(project: str) -> str:
    return "?project=" + esc(project) if project else ""


def create_volume(name: str, size_bytes: Any, project: str) -> Call:
    body = _drop_empty({"name": name, "size_bytes": size(size_bytes), "project": project})
    return Call(Request("POST", "/v1/volumes", json_body=body), into(m.Volume))


def volumes(project: str) -> Call:
    return Call(Request("GET", "/v1/volumes" + _project_query(project)), into(m.Volume))


def volume(name: str, project: str) -> Call:
    return Call(Request("GET", "/v1/volumes/" + esc(name) + _project_query(project)), into(m.Volume))


def delete_volume(name: str, project: str) -> Call:
    return Call(Request("DELETE", "/v1/volumes/" + esc(name) + _project_query(project)))


# ---- webhooks and the report ----

def add_webhook(project: str, url: str, events: Optional[Sequence[str]]) -> Call:
    body = _drop_empty({"project": project, "url": url, "events": list(events or [])})
    return Call(Request("POST", "/v1/webhooks", json_body=body), lambda s, h, b: parse_json(b))


def webhooks(project: str) -> Call:
    return Call(Request("GET", "/v1/webhooks" + _project_query(project)), lambda s, h, b: parse_json(b))


def remove_webhook(id: str) -> Call:
    return Call(Request("DELETE", "/v1/webhooks/" + esc(id)))


def test_webhook(id: str) -> Call:
    return Call(Request("POST", "/v1/webhooks/" + esc(id) + "/test"), lambda s, h, b: parse_json(b))


def webhook_deliveries(id: str) -> Call:
    return Call(Request("GET", "/v1/webhooks/" + esc(id) + "/deliveries"), lambda s, h, b: parse_json(b))


def report(project: str, since: Any) -> Call:
    q = []
    if project:
        q.append(("project", project))
    s = _since(since)
    if s:
        q.append(("since", s))
    return Call(Request("GET", "/v1/report", query=q), lambda s, h, b: parse_json(b))


# ---- fncall ----

def create_fncall_env(body: Dict[str, Any]) -> Call:
    return Call(Request("POST", "/v1/fncall", json_body=body), into(m.FncallEnv))


def fncall_envs() -> Call:
    return Call(Request("GET", "/v1/fncall"), into(m.FncallEnv))


def fncall_env(name: str) -> Call:
    return Call(Request("GET", "/v1/fncall/" + esc(name)), into(m.FncallEnv))


def delete_fncall_env(name: str) -> Call:
    return Call(Request("DELETE", "/v1/fncall/" + esc(name)))


def call_body(argv: Any = None, files: Optional[Mapping[str, Any]] = None,
              python: Optional[str] = None, script: Optional[str] = None, stdin: Any = None,
              env: Any = None, cwd: Optional[str] = None, timeout: Any = None,
              outputs: Optional[Sequence[str]] = None, keep: Optional[Sequence[str]] = None,
              file_refs: Optional[Mapping[str, str]] = None,
              output_limit: Any = None) -> Dict[str, Any]:
    if isinstance(argv, str):
        argv = [argv]
    body = _drop_empty({
        "argv": list(argv or []), "python": python, "script": script,
        "env": env_list(env), "cwd": cwd, "timeout": duration(timeout),
        "outputs": list(outputs or []), "keep": list(keep or []),
        "file_refs": dict(file_refs or {}), "output_limit": size(output_limit),
        "files": {k: b64e(v) for k, v in (files or {}).items()},
    })
    if stdin:
        body["stdin"] = b64e(stdin)
    return body


def call(name: str, body: Dict[str, Any]) -> Call:
    return Call(Request("POST", "/v1/fncall/" + esc(name), json_body=body), into(m.CallResult))


def call_stream(name: str, body: Dict[str, Any]) -> Request:
    return Request("POST", "/v1/fncall/%s/stream" % esc(name), json_body=body, stream=True)


# ---- network ----

def network_services() -> Call:
    return Call(Request("GET", "/v1/network/services"), into(m.NetworkService))


def set_network_services(catalog: Any) -> Call:
    data = catalog if isinstance(catalog, bytes) else json.dumps(catalog).encode()
    return Call(Request("PUT", "/v1/network/services", body=data, content_type="application/json"),
                into(m.NetworkService))


# ---- cluster ----

def nodes() -> Call:
    return Call(Request("GET", "/v1/nodes"), into(m.Node))


def node_action(name: str, action: str) -> Call:
    return Call(Request("POST", "/v1/nodes/%s/%s" % (esc(name), esc(action)), idempotent=True),
                into(m.Node))


# ---- projects, principals, grants, tokens, quotas, audit ----

def whoami() -> Call:
    return Call(Request("GET", "/v1/whoami"), into(m.Whoami))


def create_project(path: str) -> Call:
    return Call(Request("POST", "/v1/projects", json_body={"path": path}), into(m.Project))


def projects(under: str) -> Call:
    q = [("under", under)] if under else []
    return Call(Request("GET", "/v1/projects", query=q), into(m.Project))


def project(path: str) -> Call:
    return Call(Request("GET", "/v1/projects/" + project_path(path)), into(m.Project))


def delete_project(path: str, force: bool) -> Call:
    q = [("force", "true")] if force else []
    return Call(Request("DELETE", "/v1/projects/" + project_path(path), query=q))


def move_project(src: str, dst: str, force: bool) -> Call:
    body: Dict[str, Any] = {"from": src, "to": dst}
    if force:
        body["force"] = True
    return Call(Request("POST", "/v1/projects/move", json_body=body), into(m.Project))


def quota(project: str) -> Call:
    return Call(Request("GET", "/v1/quotas/" + project_path(project)), into(m.ProjectQuota))


def set_quota(project: str, limits: Mapping[str, Any]) -> Call:
    body = {k: (size(v) if k.endswith("_bytes") else v) for k, v in limits.items() if v is not None}
    return Call(Request("PUT", "/v1/quotas/" + project_path(project), json_body=body),
                into(m.ProjectQuota))


def placement(project: str) -> Call:
    return Call(Request("GET", "/v1/placement/" + project_path(project)),
                lambda s, h, b: parse_json(b))


def set_placement(project: str, pin: Sequence[Mapping[str, str]],
                  avoid: Sequence[Mapping[str, str]]) -> Call:
    return Call(Request("PUT", "/v1/placement/" + project_path(project),
                        json_body={"pin": [dict(x) for x in pin], "avoid": [dict(x) for x in avoid]}),
                lambda s, h, b: parse_json(b))


def create_principal(name: str, kind: str, project: str) -> Call:
    body = _drop_empty({"name": name, "kind": kind, "project": project})
    return Call(Request("POST", "/v1/principals", json_body=body), into(m.Principal))


def principals(project: str) -> Call:
    q = [("project", project)] if project else []
    return Call(Request("GET", "/v1/principals", query=q), into(m.Principal))


def grant(project: str, principal: str, role: str) -> Call:
    return Call(Request("POST", "/v1/grants",
                        json_body={"project": project, "principal": principal, "role": role}),
                into(m.Grant))


def revoke(project: str, principal: str, role: str) -> Call:
    q = [("project", project), ("principal", principal)] + ([("role", role)] if role else [])
    return Call(Request("DELETE", "/v1/grants", query=q))


def grants(project: str) -> Call:
    q = [("project", project)] if project else []
    return Call(Request("GET", "/v1/grants", query=q), into(m.Grant))


def create_token(project: str, role: str, permissions: Sequence[str], ttl: Any, principal: str,
                 kind: str, name: str) -> Call:
    body = _drop_empty({"project": project, "role": role, "permissions": list(permissions),
                        "ttl": duration(ttl), "principal": principal, "kind": kind, "name": name})
    return Call(Request("POST", "/v1/tokens", json_body=body), into(m.Token))


def tokens() -> Call:
    return Call(Request("GET", "/v1/tokens"), into(m.Token))


def revoke_token(id: str) -> Call:
    return Call(Request("DELETE", "/v1/tokens/" + esc(id)), into(m.Token))


def audit(project: str, action: str, before: int, limit: int) -> Call:
    q = [(k, str(v)) for k, v in (("project", project), ("action", action), ("before", before),
                                  ("limit", limit)) if v]
    return Call(Request("GET", "/v1/audit", query=q), into(m.AuditEntry))


def fncall_env_body(name: str, base: str, workspace: str = "",
                    toolkits: Optional[Sequence[str]] = None, project: str = "",
                    memory: Any = None, cpus: Optional[float] = None, pool_min: int = 0,
                    pool_max: int = 0, timeout: Any = None, queue_depth: int = 0,
                    queue_wait: Any = None, network: Any = None,
                    warm_imports: Optional[Sequence[str]] = None, interpreter: str = "",
                    files_bytes: Any = None) -> Dict[str, Any]:
    body = _drop_empty({
        "name": name, "base": base, "workspace": workspace, "toolkits": list(toolkits or []),
        "project": project,
        "limits": _drop_empty({"cpus": cpus, "memory_bytes": size(memory)}),
        "pool_min": pool_min, "pool_max": pool_max, "timeout": duration(timeout),
        "queue_depth": queue_depth, "queue_wait": duration(queue_wait),
        "network": network_json(network), "files_bytes": size(files_bytes),
    })
    if warm_imports is not None or interpreter:
        body["warm"] = _drop_empty({"imports": list(warm_imports or []), "interpreter": interpreter})
    return body



# ---- code (a code-interpreter sandbox's kernels) ----

def run_code(id: str, code: str, language: Optional[str] = None, context: Optional[str] = None,
             timeout: Any = None, env: Optional[Mapping[str, str]] = None) -> Call:
    body = _drop_empty({"language": language, "context": context, "timeout": duration(timeout),
                        "env": dict(env or {})})
    body["code"] = code
    # Streamed: a run may be quiet for as long as its timeout.
    return Call(Request("POST", sandbox_path(id, "code"), json_body=body, stream=True),
                lambda s, h, b: m.Execution.from_events(parse_ndjson(b)))


def code_contexts(id: str) -> Call:
    return Call(Request("GET", sandbox_path(id, "code", "contexts")),
                lambda s, h, b: [m.CodeContext(**x) for x in (parse_json(b) or [])])


def create_code_context(id: str, language: Optional[str], cwd: Optional[str]) -> Call:
    return Call(Request("POST", sandbox_path(id, "code", "contexts"),
                        json_body=_drop_empty({"language": language, "cwd": cwd})),
                lambda s, h, b: m.CodeContext(**parse_json(b)))


def restart_code_context(id: str, context: str) -> Call:
    return Call(Request("POST", sandbox_path(id, "code", "contexts", context, "restart")))


def delete_code_context(id: str, context: str) -> Call:
    return Call(Request("DELETE", sandbox_path(id, "code", "contexts", context)))
