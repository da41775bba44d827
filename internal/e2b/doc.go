// Package e2b serves E2B's API as a translator onto Corral's own: every E2B call becomes one or
// a few calls of the Corral Go SDK, so the gateway works the same in front of `corral up` and in
// front of a cluster's `corral server`.
//
//   - The control plane (this file's table): the calls the `e2b` SDKs make to create, list,
//     inspect, time out, pause, resume and kill sandboxes, made with the caller's key as the
//     Corral bearer token, so Corral's authorisation decides everything.
//   - The in-sandbox surface (envd.go, process.go, filesystem.go, files.go): envd's process and
//     filesystem Connect services, /files and /health, for requests that name a sandbox
//     (E2b-Sandbox-Id, or a "<port>-<id>." host). They prove themselves with the sandbox's envd
//     access token ([Gateway.EnvdAccessToken]) and are served with the gateway's own service
//     token, which may read and use sandboxes and nothing else.
//   - Ports: other ports of such requests go through Corral's port proxy.
//
// The wire protocol is the one recorded in docs/e2b-protocol.md (SDK 2.51.0, plus the v1 routes
// older 2.x SDKs call). Options Corral cannot honour are refused with a 400 whose message starts
// with the E2B field, never ignored.
//
// # Authentication and errors
//
// The SDK sends its API key (E2B_API_KEY) as the X-API-Key header; an "Authorization: Bearer"
// header is accepted too. It is passed to Corral unchanged; no key is a 401. Errors are E2B's
// body {"code": <the HTTP status, a number>, "message": "..."}, because the SDK tests the body's
// code (404 makes kill return false, 409 makes pause return false). Corral's 400, 401, 403,
// 404, 409, 413, 429 and 503 keep their status and message; a call on a sandbox that is unknown
// or has ended (Corral: stopped or failed, or an ID that is not one) is a 404; other Corral
// failures are a 500 with the details in the log, an unreachable Corral a 502.
//
// # Compatibility table
//
//	E2B call (route)                        Corral calls                  Notes
//	Sandbox.create (POST /v2/sandboxes,     GET /v1/environments/{t},     201 Sandbox. No timeout: Config.DefaultTimeout
//	  v1: POST /sandboxes)                  POST /v1/sandboxes            (300 s; v1: 15 s).
//	Sandbox.connect / resume                GET, [POST resume], POST ttl  200 when running, 201 when it was paused. The TTL
//	  (POST /v2/sandboxes/{id}/connect,                                   only grows: max(timeout or DefaultTimeout, time
//	  v1: POST /sandboxes/{id}/connect)                                   left). v1 requires timeout.
//	resume, deprecated                      GET, POST resume, POST ttl    409 unless paused; the TTL becomes timeout
//	  (POST /sandboxes/{id}/resume)                                       (default 15 s).
//	Sandbox.list (GET /v2/sandboxes)        GET /v1/sandboxes?label=      running and paused; pages of `limit` (≤ 100) with
//	                                                                      X-Next-Token, X-Total-Running.
//	list, v1 (GET /sandboxes)               GET /v1/sandboxes?label=      running only, one answer.
//	getInfo (GET /sandboxes/{id})           GET /v1/sandboxes/{id}        200 SandboxDetail; no envdAccessToken in it.
//	kill (DELETE /sandboxes/{id})           GET, DELETE                   204; 404 (code 404) when unknown or ended.
//	setTimeout (POST …/{id}/timeout)        POST ttl                      204; sets the end to now + timeout, shorter or
//	                                                                      longer.
//	refresh (POST …/{id}/refreshes)         GET, POST ttl                 204; extends to duration (default 15 s), never
//	                                                                      shortens.
//	pause (POST …/{id}/pause)               POST pause                    204; 409 (code 409) when already paused.
//	getMetrics (GET …/{id}/metrics)         GET …/metrics?since=          200 the node's samples in [start, end]; CPU
//	                                                                      as a share of the sandbox's CPUs, memory
//	                                                                      and disk against its limits.
//	metrics of many                         GET per ID                    200 {"sandboxes": {ID: latest sample}}.
//	  (GET /sandboxes/metrics?sandbox_ids=)
//	logs (GET /v2/sandboxes/{id}/logs,      GET trajectory                the trajectory, one entry per exec or file
//	  v1: GET /sandboxes/{id}/logs)                                       change (cursor, direction, level, search, limit).
//	updateNetwork (PUT …/{id}/network)      PUT network                   204; replaces the policy, as below.
//	fork (POST /sandboxes/{id}/fork)        POST fork                     201 [{sandbox}] per copy; count (1..64),
//	                                                                      timeout the copies' TTL (default as a
//	                                                                      create). All or nothing: a failure is the
//	                                                                      request's status, never a per-fork error.
//	createSnapshot, listSnapshots,          —                             501.
//	  deleteSnapshot
//	Template.build (POST /v3/templates,     POST /v1/builds (a Dockerfile  templates.go: the template is the environment
//	  GET+PUT …/files/{hash}, POST           and the uploads as context),  the build saves; uploads checked as build
//	  /v2/templates/{t}/builds/{b}, GET      GET /v1/builds/{id}[/logs]    contexts; status and log from the build job.
//	  …/builds/{b}/status)                                                 templateplan.go: steps to Dockerfile lines.
//	Template.exists                         GET /v1/environments/{t}      200, or 404.
//	  (GET /templates/aliases/{t})
//	delete template (DELETE /templates/{t}) DELETE /v1/environments/{t}   204; the layers stay.
//	tags (POST, DELETE /templates/tags)     —                             501.
//
// Fields of create (NewSandboxV2 / NewSandbox):
//
//	templateID         a Corral environment of that name; "base" with no such environment:
//	                   Config.DefaultTemplate ("base:default"); an ID with ':' is a layer
//	                   NAME:VERSION used as the base (environment names cannot contain ':'). No
//	                   ":latest" is added to bare names: a bare name is an environment or
//	                   nothing, so an ID never means two things. Unknown: 404 naming the ways.
//	timeout            TTL (Corral's bounds apply: at least 1 s, at most its --max-ttl).
//	metadata           labels, unchanged (so `corral ls --label` and the list filter agree). Keys
//	                   must be Corral label keys (1-64 of letters, digits, '.', '_', '/', '-';
//	                   alphanumeric at both ends), values at most 256 bytes without NUL or
//	                   newline, at most 63 entries, and no key may start with "corral-e2b/";
//	                   anything else is a 400 naming the key.
//	envVars            env (KEY=VALUE, sorted by key); names must be shell names.
//	allow_internet_access, network.allowOut, network.denyOut
//	                   the egress policy; see "Network" below.
//	network.allowPublicTraffic
//	                   true (E2B's default) accepted; false refused (no traffic tokens yet).
//	network.maskRequestHost, httpsPorts, rules, egressProxy
//	                   refused.
//	autoPause          false accepted (Corral stops a sandbox whose TTL passes); true refused:
//	                   Corral's auto_pause_after pauses after idleness, not at the timeout.
//	autoPauseMemory    true refused (no pause at timeout).
//	autoResume         enabled true accepted: Corral resumes a paused sandbox on any use;
//	                   false refused (it cannot be turned off).
//	secure             accepted and moot: every sandbox gets an envd access token.
//	mcp, iam, volumeMounts
//	                   refused when given (null or empty is fine).
//	anything else      refused as unknown.
//
// The Sandbox answer: sandboxID is Corral's ID; templateID and alias the template as given;
// clientID the sandbox's Corral node; envdVersion Config.EnvdVersion; envdAccessToken the
// sandbox's token; trafficAccessToken null; domain Config.Domain, or the request's Host when
// that is empty. SandboxDetail adds startedAt (created_at), endAt (expires_at), cpuCount
// (CPUs rounded up), memoryMB, diskSizeMB, metadata (labels but the gateway's own), state
// (creating and running: "running"; paused: "paused"), allowInternetAccess and network (the
// policy in E2B's terms), lifecycle {"onTimeout": "kill", "autoResume": true}.
//
// # Network
//
// E2B lets a sandbox reach the internet unless allow_internet_access is false or denyOut holds
// 0.0.0.0/0, and an allowOut entry wins over a denyOut entry; in Corral a deny rule wins. So:
//
//	allowOut holds 0.0.0.0/0                      mode open, no deny rules
//	internet off (flag false or deny 0.0.0.0/0)   mode allowlist with allowOut (mode none when empty);
//	                                              deny entries are then redundant and dropped
//	otherwise                                     mode open, deny = denyOut with the IPv4 ranges of
//	                                              allowOut cut out of it; an allowOut domain that a
//	                                              deny rule may cover is refused, as Corral would block
//	                                              what E2B lets through
//
// Corral then checks the rules as for any sandbox (no IPv6, no private ranges in allow rules
// unless a catalog service opens them); its refusals name the E2B field. A Corral with sandbox
// networking off refuses the default (internet on) with a message saying to pass
// allowInternetAccess: false.
//
// # List
//
// The metadata filter arrives encoded three times (docs/e2b-protocol.md §3.4) and becomes
// Corral label filters (exact match of every pair); state (comma-separated running,paused),
// startedAfter (RFC 3339), template, order (asc|desc by start time, default desc), limit (1-100,
// default 100) and nextToken are applied by the gateway. The token is the start time and ID of
// the last sandbox of the page, so sandboxes created or ended between pages neither repeat nor
// shift the rest. X-Total-Running counts the running sandboxes that match metadata and template.
// Unknown query parameters are refused.
//
// # Sandbox IDs and host names
//
// Corral IDs (sb-NODE-XXXXXXXXXXXXXXXX: lowercase, at most 52 characters) are used as E2B IDs
// unchanged. The 2.51.0 SDK never parses an ID; it only builds "<port>-<id>.<domain>" in
// getHost, which fits one DNS label (at most 58 characters with port 65535), and whoever routes
// such host names (the ports slice) splits at the first '-': the port has none.
//
// # The envd access token
//
// Create and connect answer envdAccessToken = base64url(HMAC-SHA256(Config.TokenKey, sandbox
// ID)). Nothing is stored: any gateway sharing the key can recompute and check it
// ([Gateway.CheckEnvdAccessToken]), including for signed file URLs when the sandbox is known.
// It is not a Corral label, because labels are readable with sandbox.read, and getInfo does not
// return it; connect, which does, always sets the TTL so that Corral checks sandbox.admin.
// Rotating the key invalidates every token; killing the sandbox makes its token useless.
// Revoking the Corral token that created a sandbox does not revoke its envd token (as with
// E2B's API keys). The SDK never sends its API key to the in-sandbox surface, so whoever serves
// that surface acts on a verified envd token with credentials of its own.
//
// # Concurrency
//
// A Gateway's configuration is immutable after New; each request builds its own Corral client.
// Shared state is small and locked: the per-sandbox caches of whether bash exists and of the
// users' homes, the registry of polling watchers (bounded, expiring), and the pending template
// builds with their uploads (templateBuilds.mu; bounded, expiring, files in a spool directory). Streams (Start,
// Connect, WatchDir) run one keepalive goroutine each, stopped before the stream ends.
package e2b
