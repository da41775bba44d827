package corraltest

import (
	"context"
	"fmt"
	"io/fs"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// sandbox is the fake's state for one sandbox. All fields are protected by Server.mu.
type sandbox struct {
	spec    corral.Sandbox // ID, request fields, times; State and Reason live below
	state   string
	reason  string
	ctx     context.Context // ends when the sandbox is deleted
	cancel  context.CancelFunc
	files   map[string]*node // by clean absolute path; "/" always exists
	cmds    map[string]*command
	cmdList []string
	// watchers are the open watches of the tree.
	watchers []*fakeWatch
	// samples are its resource samples, as SetMetrics gave them.
	samples []corral.MetricSample
}

func (sb *sandbox) view() corral.Sandbox {
	v := sb.spec
	v.State, v.Reason = sb.state, sb.reason
	v.Toolkits = slices.Clone(v.Toolkits)
	v.Env = slices.Clone(v.Env)
	return v
}

// idRE matches the real server's sandbox IDs ("sb-", the node name, "-", 16 base32
// characters) and the fake's own, shorter ones ("sb-1").
var idRE = regexp.MustCompile(`^sb-([a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?-[a-z2-7]{16}|[0-9]+)$`)

// validID reports whether id has the shape of a sandbox ID: the real server refuses any
// other with 400 before looking it up.
func validID(id string) bool { return idRE.MatchString(id) }

// lookupLocked returns the sandbox named by the request's {id}.
//
// Preconditions: s.mu is held.
func (s *Server) lookupLocked(r *http.Request) (*sandbox, *httpError) {
	id := r.PathValue("id")
	if !validID(id) {
		return nil, invalid("id", "%q is not a sandbox ID (sb-NODE-XXXXXXXXXXXXXXXX)", id)
	}
	sb, ok := s.sandboxes[id]
	if !ok {
		return nil, notFound("sandbox %s not found", id)
	}
	return sb, nil
}

// runningLocked is lookupLocked for routes that need a running sandbox.
//
// Preconditions: s.mu is held.
func (s *Server) runningLocked(r *http.Request) (*sandbox, *httpError) {
	sb, err := s.lookupLocked(r)
	if err != nil {
		return nil, err
	}
	if sb.state != corral.StateRunning {
		return nil, conflict("sandbox %s is %s, not running", sb.spec.ID, sb.state)
	}
	return sb, nil
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req corral.CreateRequest
	if err := decodeBody(r, &req); err != nil {
		fail(w, err)
		return
	}
	ttl, idle := time.Hour, time.Duration(0)
	var err error
	if req.TTL != "" {
		if ttl, err = time.ParseDuration(req.TTL); err != nil || ttl <= 0 {
			fail(w, invalid("ttl", "ttl %q is not a positive Go duration", req.TTL))
			return
		}
	}
	if req.IdleTTL != "" {
		if idle, err = time.ParseDuration(req.IdleTTL); err != nil || idle < 0 {
			fail(w, invalid("idle_ttl", "idle_ttl %q is not a Go duration", req.IdleTTL))
			return
		}
	}
	if req.Tier != "" && req.Tier != "container" {
		fail(w, invalid("tier", "tier %q is not supported", req.Tier))
		return
	}
	runtime := "runc"
	switch req.Runtime {
	case "", "runc":
	case "gvisor":
		runtime = "gvisor"
	default:
		fail(w, invalid("runtime", "%q: want runc or gvisor", req.Runtime))
		return
	}
	for i, e := range req.Env {
		if !strings.Contains(e, "=") {
			fail(w, invalid(fmt.Sprintf("env[%d]", i), "is not KEY=VALUE (no '=')"))
			return
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if req.Project == "" {
		req.Project = s.callerProjectLocked(r)
	}
	project, perr := projectArg("project", req.Project)
	if perr != nil {
		fail(w, perr)
		return
	}
	if e := s.allowLocked(r, corral.PermSandboxCreate, project); e != nil {
		refuse(w, e)
		return
	}
	if _, ok := s.iam.projects[project]; !ok {
		fail(w, &httpError{http.StatusNotFound, corral.CodeNotFound, "project " + project + " not found", "project"})
		return
	}
	if req.Environment != "" {
		env, ok := s.environments[req.Environment]
		if !ok {
			fail(w, invalid("environment", "environment %q is not saved (see `corral env ls`)", req.Environment))
			return
		}
		if req.Base == "" {
			req.Base, req.Workspace, req.Toolkits = env.Base, env.Workspace, env.Toolkits
		}
	}
	req.Toolkits = slices.Clone(req.Toolkits)
	if err := s.checkLayersLocked(&req.Base, &req.Workspace, req.Toolkits); err != nil {
		fail(w, err)
		return
	}

	if e := s.admitLocked(project, req.Limits, "container"); e != nil {
		refuse(w, e)
		return
	}

	s.nextSandbox++
	id := "sb-" + strconv.Itoa(s.nextSandbox)
	now := timeNow()
	sb := &sandbox{
		spec: corral.Sandbox{
			ID:             id,
			Project:        project,
			Node:           "fake-node",
			Tier:           "container",
			Runtime:        runtime,
			Base:           req.Base,
			Workspace:      req.Workspace,
			Toolkits:       req.Toolkits,
			Limits:         req.Limits,
			Env:            req.Env,
			Labels:         req.Labels,
			Hostname:       req.Hostname,
			Environment:    req.Environment,
			CreatedAt:      now,
			ExpiresAt:      now.Add(ttl),
			IdleTTLSeconds: int64(idle / time.Second),
			LastActivityAt: now,
		},
		state: corral.StateRunning,
		files: map[string]*node{},
		cmds:  map[string]*command{},
	}
	if sb.spec.Hostname == "" {
		sb.spec.Hostname = id
	}
	sb.ctx, sb.cancel = context.WithCancel(s.ctx)
	for _, d := range []string{"/", "/tmp", "/root"} {
		sb.files[d] = &node{dir: true, mode: fs.ModeDir | 0o755, mtime: now}
	}
	s.sandboxes[id] = sb
	s.sbOrder = append(s.sbOrder, id)
	s.auditLocked(r, "sandbox.create", project, id, "")
	writeJSON(w, http.StatusCreated, sb.view())
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	// state is repeatable; any may match.
	states := q["state"]
	for _, st := range states {
		switch st {
		case corral.StateCreating, corral.StateRunning, corral.StatePaused, corral.StateOff, corral.StateStopped, corral.StateFailed:
		default:
			fail(w, invalid("state", "%q is not a state (creating, running, paused, off, stopped, failed)", st))
			return
		}
	}
	project := q.Get("project")
	if project != "" {
		var err *httpError
		if project, err = projectArg("project", project); err != nil {
			fail(w, err)
			return
		}
	}
	want := map[string]string{}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			fail(w, invalid("label", "label filter %q is not KEY=VALUE", l))
			return
		}
		want[k] = v
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if project == "" {
		project = s.callerProjectLocked(r)
	}
	out := []corral.Sandbox{}
	for _, id := range s.sbOrder {
		sb := s.sandboxes[id]
		if (len(states) > 0 && !slices.Contains(states, sb.state)) || !within(sb.spec.Project, project) {
			continue
		}
		match := true
		for k, v := range want {
			if got, ok := sb.spec.Labels[k]; !ok || got != v {
				match = false
			}
		}
		if match {
			out = append(out, sb.view())
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, err := s.lookupLocked(r)
	if err != nil {
		fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, sb.view())
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, err := s.lookupLocked(r)
	if err != nil {
		fail(w, err)
		return
	}
	if sb.state == corral.StateRunning {
		sb.state, sb.reason = corral.StateStopped, corral.ReasonDeleted
		sb.spec.EndedAt = timeNow()
		sb.cancel()
	}
	writeJSON(w, http.StatusOK, sb.view())
}

func (s *Server) setTTL(w http.ResponseWriter, r *http.Request) {
	var req corral.TTLRequest
	if err := decodeBody(r, &req); err != nil {
		fail(w, err)
		return
	}
	ttl, perr := time.ParseDuration(req.TTL)
	if perr != nil || ttl <= 0 {
		fail(w, invalid("ttl", "ttl %q is not a positive Go duration", req.TTL))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, err := s.runningLocked(r)
	if err != nil {
		fail(w, err)
		return
	}
	sb.spec.ExpiresAt = timeNow().Add(ttl)
	writeJSON(w, http.StatusOK, sb.view())
}

// SetMetrics sets the resource samples GET /v1/sandboxes/{id}/metrics answers for sandbox id
// (the fake samples nothing itself). It reports whether the sandbox exists.
func (s *Server) SetMetrics(id string, samples []corral.MetricSample) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if ok {
		sb.samples = slices.Clone(samples)
	}
	return ok
}

// metrics serves GET /v1/sandboxes/{id}/metrics?since=: the samples SetMetrics gave, after since.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	var since time.Time
	if v := r.URL.Query().Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			writeError(w, http.StatusBadRequest, corral.CodeInvalid, "since: not an RFC 3339 time", "since")
			return
		}
		since = t
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, err := s.lookupLocked(r)
	if err != nil {
		fail(w, err)
		return
	}
	out := corral.Metrics{Samples: []corral.MetricSample{}, IntervalSeconds: 5}
	for _, m := range sb.samples {
		if m.At.After(since) {
			out.Samples = append(out.Samples, m)
		}
	}
	writeJSON(w, http.StatusOK, out)
}
