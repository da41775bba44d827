// Package apiserver serves Corral's REST API: authentication, the control plane (sandboxes, layers,
// info) and the routing of each sandbox's data plane (exec, commands, files) to the edge that runs
// it. It keeps no per-sandbox state of its own: everything durable is in the store, everything live
// is on the edge, so several replicas can serve one store.
package apiserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/build"
	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/console"
	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/layers"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
	"github.com/corral-dev/corral/internal/trace"
	"github.com/corral-dev/corral/internal/webhook"
)

// Server is the HTTP API of one Corral installation.
type Server struct {
	log    *slog.Logger
	store  *store.Store
	edge   *edge.Edge
	layers *layers.Store
	info   Info

	// refusals bounds how many refused requests of one token reach the audit log.
	refusals refusalLimiter

	// importMu serialises layer imports, so that dropping the tree of a rejected import can never
	// race with another import publishing the same content.
	importMu sync.Mutex

	// builds runs Dockerfile builds (SetBuilds); nil where no edge runs in this process.
	builds     *build.Jobs
	buildSpool string

	// hooks, when set, delivers this process's events to webhooks (SetWebhooks).
	hooks *webhook.Dispatcher

	// servesNodes: this API is a cluster edge's, served only to the cluster's servers
	// (ServeClusterServers), and takes its callers from them instead of from tokens.
	servesNodes bool

	// fleet deletes the sandboxes a forced project delete removes: the local edge's (New), or
	// every node's through a cluster server (SetFleet). volumes keeps the volumes (New: the
	// local edge; SetVolumes: a cluster server's).
	fleet   Fleet
	volumes Volumes
	// environments keeps the environments and fncall environments (New: the local edge;
	// SetEnvironments: a cluster server's).
	environments Environments
	// auditor records the audit entries of the requests this API serves: the store (New), or a
	// cluster's servers for an edge (SetAuditor).
	auditor Auditor
}

// Auditor records an audit entry (store.AddAudit: fallback is the caller's token's project,
// for an entry naming a project that does not exist).
type Auditor interface {
	AddAudit(ctx context.Context, e model.AuditEntry, fallback string) error
}

// SetAuditor makes a cluster edge's API record its audit entries through a (the servers),
// which take the entry's principal and token from the caller they sealed for the edge.
func (s *Server) SetAuditor(a Auditor) { s.auditor = a }

// New returns a Server. info is served by GET /v1/info (Sandboxes and Disk are filled in per
// call).
func New(log *slog.Logger, st *store.Store, e *edge.Edge, ls *layers.Store, info Info) *Server {
	s := &Server{log: log, store: st, edge: e, layers: ls, info: info, volumes: noVolumes{}}
	if st != nil { // a cluster's edge has none: the servers record its audit entries (SetAuditor)
		s.auditor = st
	}
	if e != nil {
		s.fleet, s.volumes, s.environments = localFleet{s}, edgeVolumes{e}, edgeEnvironments{e}
	}
	return s
}

// ServeClusterServers makes this API a cluster edge's: every request's caller is the one its
// server authenticated and sent along (internal/nodeproto), and no token is looked up here.
// The routes of ServerPaths are the servers' (ServerHandler): the edge answers them 404. The
// handler must be served only behind clusterauth.RequireServer, which lets nothing but the
// cluster's servers reach it.
func (s *Server) ServeClusterServers() { s.servesNodes = true }

// HashToken returns the form in which a token is stored.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// Handler returns the API's HTTP handler. Every route but /healthz needs a token; each states the
// permission it needs and on which project (guard), and management actions are audited.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write([]byte("ok\n"))
	})
	// The web console's static files carry no data and need no token; its pages call this API
	// with the user's token like any client.
	mux.Handle("/ui/", console.Handler())
	mux.Handle("/ui", console.Handler())
	api := http.NewServeMux()
	api.HandleFunc("GET /v1/info", s.getInfo)
	api.HandleFunc("POST /v1/sandboxes", s.createSandbox)
	api.HandleFunc("GET /v1/sandboxes/{id}", s.guard(iam.SandboxRead, "", s.onSandbox, s.getSandbox))
	api.HandleFunc("DELETE /v1/sandboxes/{id}", s.guard(iam.SandboxAdmin, "sandbox.delete", s.onSandbox, s.deleteSandbox))
	api.HandleFunc("POST /v1/sandboxes/{id}/ttl", s.guard(iam.SandboxAdmin, "sandbox.ttl", s.onSandbox, s.setTTL))
	api.HandleFunc("POST /v1/sandboxes/{id}/snapshot", s.guard(iam.SandboxAdmin|iam.LayerPublish, "sandbox.snapshot", s.onSandbox, s.snapshot))
	api.HandleFunc("POST /v1/sandboxes/{id}/fork", s.guard(iam.SandboxAdmin|iam.SandboxCreate, "sandbox.fork", s.onSandbox, s.fork))
	api.HandleFunc("POST /v1/sandboxes/{id}/pause", s.guard(iam.SandboxAdmin, "sandbox.pause", s.onSandbox, s.lifecycle(s.edge.Pause)))
	api.HandleFunc("POST /v1/sandboxes/{id}/resume", s.guard(iam.SandboxAdmin, "sandbox.resume", s.onSandbox, s.lifecycle(s.edge.Resume)))
	api.HandleFunc("POST /v1/sandboxes/{id}/power", s.guard(iam.SandboxAdmin, "sandbox.power", s.onSandbox, s.power))
	api.HandleFunc("PUT /v1/sandboxes/{id}/network", s.guard(iam.SandboxAdmin, "sandbox.network", s.onSandbox, s.setNetwork))
	api.HandleFunc("GET /v1/sandboxes/{id}/network/blocked", s.guard(iam.SandboxRead, "", s.onSandbox, s.blockedAttempts))
	api.HandleFunc("GET /v1/sandboxes/{id}/fetch", s.guard(iam.SandboxRead, "", s.onSandbox, func(w http.ResponseWriter, r *http.Request) {
		st, err := s.edge.FetchStats(r.Context(), r.PathValue("id"))
		if err != nil {
			s.fail(w, r, err)
			return
		}
		httpjson.Write(w, http.StatusOK, fetchStats(st))
	}))
	api.HandleFunc("GET /v1/metrics", s.guard(iam.Operator, "", operator, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		s.edge.WriteMetrics(w)
		// The process's own, for leak hunting (make soak watches it).
		fmt.Fprintf(w, "# HELP go_goroutines Goroutines of this corral process.\n# TYPE go_goroutines gauge\ngo_goroutines %d\n", runtime.NumGoroutine())
		s.WriteWebhookMetrics(w)
	}))
	api.HandleFunc("POST /v1/builds", s.startBuild)
	api.HandleFunc("GET /v1/builds", s.listBuilds)
	api.HandleFunc("GET /v1/builds/{id}", s.guard(iam.LayerRead, "", s.onBuild, s.getBuild))
	api.HandleFunc("GET /v1/builds/{id}/logs", s.guard(iam.LayerRead, "", s.onBuild, s.buildLogs))
	api.HandleFunc("POST /v1/builds/{id}/cancel", s.guard(iam.LayerPublish|iam.SandboxAdmin, "build.cancel", s.onBuild, s.cancelBuild))
	api.HandleFunc("DELETE /v1/layers/{name}/{version}", s.guard(iam.LayerPublish, "layer.delete", s.onLayerName, func(w http.ResponseWriter, r *http.Request) {
		l, err := s.edge.DeleteLayer(r.Context(), r.PathValue("name"), r.PathValue("version"))
		if err != nil {
			s.fail(w, r, err)
			return
		}
		httpjson.Write(w, http.StatusOK, l)
	}))
	api.HandleFunc("POST /v1/layers/gc", s.guard(iam.Operator, "layer.gc", operator, func(w http.ResponseWriter, r *http.Request) {
		s.importMu.Lock() // no import commits a tree while the sweep runs
		defer s.importMu.Unlock()
		res, err := s.edge.GC(r.Context())
		if err != nil {
			s.fail(w, r, err)
			return
		}
		httpjson.Write(w, http.StatusOK, res)
	}))
	api.HandleFunc("POST /v1/layers", s.guard(iam.LayerPublish, "layer.publish", s.onQueryProject("project", "name"), s.importLayer))
	api.HandleFunc("GET /v1/layers/{name}/{version}/stats", s.layerStats)
	api.HandleFunc("PATCH /v1/layers/{name}/{version}", s.guardIn(iam.LayerPublish, "layer.set", s.onLayerName, s.setLayer))
	api.HandleFunc("GET /v1/fncall", func(w http.ResponseWriter, r *http.Request) {
		c := who(r)
		out := []model.FncallEnv{}
		for _, env := range s.edge.FncallEnvs() {
			if p, err := iam.ParsePath("project", env.Project); err == nil && c.perms(p).Has(iam.SandboxRead) {
				out = append(out, env)
			}
		}
		httpjson.Write(w, http.StatusOK, out)
	})
	api.HandleFunc("GET /v1/fncall/{name}", s.guard(iam.SandboxRead, "", s.onFncall, func(w http.ResponseWriter, r *http.Request) {
		env, err := s.edge.FncallEnv(r.PathValue("name"))
		if err != nil {
			s.fail(w, r, err)
			return
		}
		httpjson.Write(w, http.StatusOK, env)
	}))
	api.HandleFunc("POST /v1/fncall/{name}", s.guard(iam.SandboxUse, "", s.onFncall, func(w http.ResponseWriter, r *http.Request) { s.call(w, r, false) }))
	api.HandleFunc("POST /v1/fncall/{name}/stream", s.guard(iam.SandboxUse, "", s.onFncall, func(w http.ResponseWriter, r *http.Request) { s.call(w, r, true) }))
	if s.servesNodes {
		for _, p := range ServerPaths {
			api.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
				httpjson.Error(w, r, s.log, errdefs.NotFound("%s %s is served by the cluster's servers, not by an edge", r.Method, r.URL.Path))
			})
		}
		s.volumeBlobRoutes(api)
	} else {
		s.serverRoutes(api)
	}
	api.HandleFunc("GET /v1/sandboxes/{id}/metrics", s.guard(iam.SandboxRead, "", s.onSandbox, s.route().ServeHTTP))
	// Everything else under a sandbox is its data plane, served by the edge that runs it.
	api.Handle("/v1/sandboxes/{id}/", s.guard(iam.SandboxUse, "", s.onSandbox, s.route().ServeHTTP))
	api.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httpjson.Error(w, r, s.log, errdefs.NotFound("no API route %s %s", r.Method, r.URL.Path))
	})
	mux.Handle("/", s.authenticate(api))
	// A request's spans continue its caller's trace (a cluster server's, or a client's).
	return trace.Extract(mux)
}

// route sends a sandbox data-plane request to the edge named by the sandbox ID.
func (s *Server) route() http.Handler {
	local := s.edge.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if !edge.ValidID(id) {
			httpjson.Error(w, r, s.log, errdefs.Invalid("id", "%q is not a sandbox ID (sb-NODE-XXXXXXXXXXXXXXXX)", id))
			return
		}
		if node := edge.NodeOf(id); node != s.edge.Node() {
			httpjson.Error(w, r, s.log, errdefs.UnknownSandbox(id, "(node %s is not known here)", node))
			return
		}
		local.ServeHTTP(w, r)
	})
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	if rec, ok := w.(*statusRecorder); ok {
		rec.err = err
	}
	httpjson.Error(w, r, s.log, err)
}

func (s *Server) getInfo(w http.ResponseWriter, r *http.Request) {
	info := s.info
	if who(r).perms("").Has(iam.Operator) { // the installation's load is the operator's business
		info.Sandboxes = s.edge.Count()
		if d, ok, err := s.edge.DiskPromise(); err == nil && ok {
			info.Disk = &model.DiskAccount{PromisedBytes: d.Promised, AllocatedBytes: d.Allocated,
				FreeBytes: d.Free, Overcommit: d.Overcommit, HaveBytes: d.Have()}
		}
	}
	httpjson.Write(w, http.StatusOK, model.Info(info))
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) {
	var req model.CreateRequest
	if err := httpjson.Decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	c := who(r)
	project, err := c.project("project", req.Project)
	if err == nil {
		err = c.require(iam.SandboxCreate, project)
	}
	if err != nil {
		s.audit(r, "sandbox.create", project, "", err, "")
		s.fail(w, r, err)
		return
	}
	req.Project = project
	key, err := idempotencyKey(r, c, req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	rec, replayed, err := s.edge.CreateOnce(r.Context(), req, key)
	if err != nil {
		s.audit(r, "sandbox.create", project, "", err, "")
		s.fail(w, r, err)
		return
	}
	if replayed {
		// The retry of a create that happened: the same sandbox, nothing new to audit.
		w.Header().Set("Idempotent-Replayed", "true")
		httpjson.Write(w, http.StatusOK, rec.Sandbox)
		return
	}
	s.audit(r, "sandbox.create", project, rec.ID, nil, "")
	httpjson.Write(w, http.StatusCreated, rec.Sandbox)
}

// maxIdempotencyKey bounds the Idempotency-Key header.
const maxIdempotencyKey = 128

// idempotencyKey reads a create's Idempotency-Key header: the key, scoped to the caller's
// principal, with a hash of the request it came with (the request after defaults the caller
// left out, such as the project, were filled in).
func idempotencyKey(r *http.Request, c *caller, req model.CreateRequest) (*store.Idempotency, error) {
	k := r.Header.Get("Idempotency-Key")
	if k == "" {
		return nil, nil
	}
	if len(k) > maxIdempotencyKey || strings.ContainsFunc(k, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
		return nil, errdefs.Invalid("Idempotency-Key", "must be 1-%d printable ASCII characters without spaces", maxIdempotencyKey)
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	return &store.Idempotency{Principal: c.tok.Principal, Key: k, RequestHash: hex.EncodeToString(sum[:])}, nil
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var f store.SandboxFilter
	for _, st := range q["state"] {
		switch st {
		case model.StateCreating, model.StateRunning, model.StatePaused, model.StateOff, model.StateDeleting, model.StateStopped, model.StateFailed:
			f.States = append(f.States, st)
		default:
			s.fail(w, r, errdefs.Invalid("state", "%q is not a state (creating, running, paused, off, deleting, stopped, failed)", st))
			return
		}
	}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			s.fail(w, r, errdefs.Invalid("label", "%q is not KEY=VALUE", l))
			return
		}
		if f.Labels == nil {
			f.Labels = make(map[string]string)
		}
		f.Labels[k] = v
	}
	for k := range q {
		if k != "state" && k != "label" && k != "project" {
			s.fail(w, r, errdefs.Invalid(k, "unknown query parameter"))
			return
		}
	}
	c := who(r)
	under, err := c.project("project", q.Get("project"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !iam.Within(under, c.tok.ProjectPath) {
		under = c.tok.ProjectPath // nothing above the token's scope is visible anyway
	}
	f.Project = &under
	var recs []*store.Sandbox
	if s.edge != nil {
		recs, err = s.edge.List(r.Context(), f) // with the live sandboxes' latest activity
	} else {
		recs, err = s.store.ListSandboxes(r.Context(), f)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]model.Sandbox, 0, len(recs))
	for _, rec := range recs {
		if p, err := iam.ParsePath("project", rec.Project); err == nil && c.perms(p).Has(iam.SandboxRead) {
			out = append(out, rec.Sandbox)
		}
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"sandboxes": out})
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) {
	switch wait := r.URL.Query().Get("wait"); wait {
	case "":
	case "running":
		// Like any data-plane call, ?wait=running resumes a paused sandbox before answering, and
		// so needs what a data-plane call needs.
		if p, _, _ := s.onSandbox(r); who(r).require(iam.SandboxUse, p) != nil {
			s.fail(w, r, who(r).require(iam.SandboxUse, p))
			return
		}
		if _, err := s.edge.Resume(r.Context(), r.PathValue("id")); err != nil && !errors.Is(err, errdefs.ErrConflict) {
			s.fail(w, r, err)
			return
		}
	default:
		s.fail(w, r, errdefs.Invalid("wait", "%q is not a state to wait for (running)", wait))
		return
	}
	rec, err := s.edge.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, rec.Sandbox)
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) {
	rec, err := s.edge.Delete(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, rec.Sandbox)
}

// lifecycle serves a body-less POST that moves a sandbox between states (pause, resume).
func (s *Server) lifecycle(do func(context.Context, string) (*store.Sandbox, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		rec, err := do(r.Context(), r.PathValue("id"))
		if err != nil {
			s.fail(w, r, err)
			return
		}
		httpjson.Write(w, http.StatusOK, rec.Sandbox)
	}
}

// power serves POST /v1/sandboxes/{id}/power (corral.PowerRequest), for vm sandboxes.
func (s *Server) power(w http.ResponseWriter, r *http.Request) {
	var req model.PowerRequest
	if err := httpjson.Decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	rec, err := s.edge.Power(r.Context(), r.PathValue("id"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, rec.Sandbox)
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) {
	var req model.SnapshotRequest
	if err := httpjson.Decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	s.importMu.Lock() // a snapshot publishes a layer, like an import
	defer s.importMu.Unlock()
	l, err := s.edge.Snapshot(r.Context(), r.PathValue("id"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusCreated, l)
}

// fork serves POST /v1/sandboxes/{id}/fork (corral.ForkRequest): 201 with the copies. A count
// given as 0 is refused; an absent one is 1.
func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Count    *int              `json:"count"`
		Labels   map[string]string `json:"labels"`
		DiskOnly bool              `json:"disk_only"`
		TTL      string            `json:"ttl"`
	}
	if err := httpjson.Decode(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	req := model.ForkRequest{Count: 1, Labels: body.Labels, DiskOnly: body.DiskOnly, TTL: body.TTL}
	if body.Count != nil {
		if *body.Count < 1 {
			s.fail(w, r, errdefs.Invalid("count", "%d: want 1 to %d copies", *body.Count, model.MaxForkCount))
			return
		}
		req.Count = *body.Count
	}
	recs, err := s.edge.Fork(r.Context(), r.PathValue("id"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := model.ForkResult{Sandboxes: make([]model.Sandbox, len(recs))}
	for i, rec := range recs {
		out.Sandboxes[i] = rec.Sandbox
	}
	httpjson.Write(w, http.StatusCreated, out)
}

func (s *Server) setTTL(w http.ResponseWriter, r *http.Request) {
	var req model.TTLRequest
	if err := httpjson.Decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	rec, err := s.edge.SetTTL(r.Context(), r.PathValue("id"), req.TTL)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, rec.Sandbox)
}

func (s *Server) tagLayer(w http.ResponseWriter, r *http.Request) {
	var req model.TagRequest
	if err := httpjson.Decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	name, tag := r.PathValue("name"), r.PathValue("tag")
	if err := catalog.ValidateLayerName("name", "tag", name, tag); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := catalog.ValidateLayerName("name", "version", name, req.Version); err != nil {
		s.fail(w, r, err)
		return
	}
	l, err := s.store.TagLayer(r.Context(), name, tag, req.Version)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, l)
}

func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request) {
	var req model.NetworkPolicy
	if err := httpjson.Decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	rec, err := s.edge.SetNetwork(r.Context(), r.PathValue("id"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, rec.Sandbox)
}

func (s *Server) blockedAttempts(w http.ResponseWriter, r *http.Request) {
	list, err := s.edge.BlockedAttempts(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, list)
}

func (s *Server) importLayer(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	name, version, kind := q.Get("name"), q.Get("version"), q.Get("kind")
	if err := catalog.ValidateLayerName("name", "version", name, version); err != nil {
		s.fail(w, r, err)
		return
	}
	switch kind {
	case model.KindBase, model.KindWorkspace, model.KindToolkit, model.KindVMImage:
	default:
		s.fail(w, r, errdefs.Invalid("kind", "%q is not a layer kind (base, workspace, toolkit, vm-image)", kind))
		return
	}
	var imageConfig *model.ImageConfig
	if raw := q.Get("image_config"); raw != "" {
		if len(raw) > 64<<10 {
			s.fail(w, r, errdefs.Invalid("image_config", "larger than 64 KiB"))
			return
		}
		imageConfig = new(model.ImageConfig)
		dec := json.NewDecoder(strings.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(imageConfig); err != nil {
			s.fail(w, r, errdefs.Invalid("image_config", "%v", err))
			return
		}
		if err := catalog.ValidateImageConfig(imageConfig); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	project, _ := who(r).project("project", q.Get("project")) // checked by the guard
	below, err := catalog.CheckBelowIn(r.Context(), s.catalogue(), kind, project, q["below"])
	if err != nil {
		s.fail(w, r, err)
		return
	}
	private, err := queryBool(q, "private")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	public, err := queryBool(q, "public")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if private && public {
		s.fail(w, r, errdefs.Invalid("public", "a layer cannot be both private and public"))
		return
	}
	if err := s.checkPublicBelow(r.Context(), public, project, below); err != nil {
		s.fail(w, r, err)
		return
	}
	log := s.log.With("layer", name+":"+version)
	start := time.Now()
	s.importMu.Lock()
	defer s.importMu.Unlock()
	blob, err := s.layers.ImportTar(r.Context(), r.Body)
	if err != nil {
		s.fail(w, r, fmt.Errorf("import layer %s:%s: %w", name, version, err))
		return
	}
	// A refused publish drops the imported blob unless something else uses the same content.
	l, created, err := s.edge.PublishLayer(r.Context(), model.Layer{
		Name: name, Version: version, Kind: kind, Digest: blob.Digest,
		Size: blob.Size, Files: blob.Files, CreatedAt: time.Now().UTC(), ImageConfig: imageConfig, Below: below,
		Project: project, Private: private, Public: public,
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		log.Info("layer published", "digest", l.Digest, "bytes", l.Size, "files", l.Files, "took", time.Since(start))
	}
	httpjson.Write(w, status, l)
}

// maxCallBody bounds a call's request: its files (base64 in JSON) and stdin.
const maxCallBody = 256 << 20

// call runs one fncall: the result as one JSON object, or, streamed, the output as NDJSON events
// ending with an exit event that carries the result.
func (s *Server) call(w http.ResponseWriter, r *http.Request, stream bool) {
	var req model.CallRequest
	if err := httpjson.DecodeLimit(r, &req, maxCallBody); err != nil {
		s.fail(w, r, err)
		return
	}
	name := r.PathValue("name")
	if !stream {
		res, err := s.edge.Call(r.Context(), name, req, nil)
		if err != nil {
			s.callFailed(w, r, err)
			return
		}
		httpjson.Write(w, http.StatusOK, res)
		return
	}
	out := edge.NewEventWriter(w)
	res, err := s.edge.Call(r.Context(), name, req, out.Send)
	if err != nil {
		if !out.Started() {
			s.callFailed(w, r, err)
			return
		}
		out.Send(model.Event{Type: model.EventError, Data: []byte(err.Error())})
		return
	}
	exit := res.Exit
	out.Send(model.Event{Type: model.EventExit, Exit: &exit, Result: res})
}

// callFailed answers a failed call; a busy environment's 429 says when to retry.
func (s *Server) callFailed(w http.ResponseWriter, r *http.Request, err error) {
	if d := edge.RetryAfter(err); d > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((d+time.Second-1)/time.Second)))
	}
	s.fail(w, r, err)
}

// queryBool reads the boolean query parameter name: absent, true or false.
func queryBool(q url.Values, name string) (bool, error) {
	switch q.Get(name) {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	}
	return false, errdefs.Invalid(name, "%q is not true or false", q.Get(name))
}

// checkPublicBelow refuses to make a layer of project at (canonical) public on parts (below)
// that are not: every project would see a layer it cannot use.
func (s *Server) checkPublicBelow(ctx context.Context, public bool, at string, below []string) error {
	if !public {
		return nil
	}
	return catalog.CheckPublicPartsIn(ctx, s.catalogue(), "below", at, below)
}

// catalogue reads the catalogue for this API's requests: the edge's reader (the servers, for the
// request's caller, on a cluster's edge), or the store (a cluster's server).
func (s *Server) catalogue() edge.CatalogReader {
	if s.edge != nil {
		return s.edge.Catalogue()
	}
	return &catalog.Resolver{Store: s.store}
}

func (s *Server) listLayers(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("name")
	if s.edge != nil { // a cluster's servers adopt nothing (edge.Config.Publisher)
		if _, err := s.edge.SyncShared(r.Context(), name); err != nil {
			s.log.Warn("read the shared catalogue; listing this node's layers", "err", err)
		}
	}
	ls, err := s.store.ListLayers(r.Context(), name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	c := who(r)
	out := []model.Layer{}
	for _, l := range ls {
		if c.canReadLayer(l) {
			out = append(out, l)
		}
	}
	httpjson.Write(w, http.StatusOK, map[string]any{"layers": out})
}

func (s *Server) getLayer(w http.ResponseWriter, r *http.Request) {
	if l, ok := s.readableLayer(w, r); ok {
		httpjson.Write(w, http.StatusOK, l)
	}
}

// readableLayer returns the layer version the path names if the caller may read it; otherwise
// it has answered with the error.
func (s *Server) readableLayer(w http.ResponseWriter, r *http.Request) (model.Layer, bool) {
	name, version := r.PathValue("name"), r.PathValue("version")
	if err := catalog.ValidateLayerName("name", "version", name, version); err != nil {
		s.fail(w, r, err)
		return model.Layer{}, false
	}
	l, err := s.catalogue().ReadableLayer(r.Context(), name, version)
	if err == nil && !who(r).canReadLayer(l) {
		err = layerNotFound(name, version)
	}
	if err != nil {
		s.fail(w, r, err)
		return model.Layer{}, false
	}
	return l, true
}

// setLayer changes a published version's settings (its background fill rate, whether it is
// public).
func (s *Server) setLayer(w http.ResponseWriter, r *http.Request, project string) {
	var body model.LayerSettings
	if err := httpjson.Decode(r, &body); err != nil {
		s.fail(w, r, err)
		return
	}
	if body.FillRate == nil && body.Public == nil {
		s.fail(w, r, errdefs.Invalid("fill_rate", "nothing to set (fill_rate, public)"))
		return
	}
	if body.FillRate != nil && *body.FillRate < -1 {
		s.fail(w, r, errdefs.Invalid("fill_rate", "%d: want bytes per second, 0 for the node's default or -1 for never", *body.FillRate))
		return
	}
	name, version := r.PathValue("name"), r.PathValue("version")
	if err := catalog.ValidateLayerName("name", "version", name, version); err != nil {
		s.fail(w, r, err)
		return
	}
	// Both settings are checked before either is set, so a refusal changes nothing. The version
	// is read as its project (the guard's) sees it: from the catalogue the edge reads (the
	// servers, on a cluster's edge; adopted from the shared catalogue on a miss under `corral
	// up`).
	l, err := s.catalogue().VisibleLayer(r.Context(), project, name, version)
	if err == nil && (l.Name != name || l.Version != version) {
		err = errdefs.Invalid("version", "%s:%s is a tag; settings belong to versions (%s:%s)", name, version, l.Name, l.Version)
	}
	if err == nil && body.Public != nil && *body.Public {
		var at string
		if at, err = iam.ParsePath("project", l.Project); err == nil {
			err = s.checkPublicBelow(r.Context(), true, at, l.Below)
		}
	}
	if err == nil && body.FillRate != nil {
		l, err = s.edge.SetLayerFillRate(r.Context(), name, version, *body.FillRate)
	}
	if err == nil && body.Public != nil {
		l, err = s.edge.SetLayerPublic(r.Context(), name, version, *body.Public)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, l)
}

// layerStats describes a layer version's storage and how its data reached this node.
func (s *Server) layerStats(w http.ResponseWriter, r *http.Request) {
	if n := r.URL.Query().Get("node"); n != "" && n != s.edge.Node() {
		s.fail(w, r, errdefs.NotFound("node %s: this is node %s", n, s.edge.Node()))
		return
	}
	l, ok := s.readableLayer(w, r)
	if !ok {
		return
	}
	st, err := s.edge.LayerStats(r.Context(), l.Digest)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := model.LayerStats{Name: l.Name, Version: l.Version, Digest: l.Digest, Node: s.edge.Node(),
		Format: st.Format, ImageBytes: st.ImageSize, DataBytes: st.DataSize}
	if st.Fetch != nil {
		f := fetchStats(*st.Fetch)
		out.Fetch = &f
	}
	if st.Cache != nil {
		c := chunkCacheStats(*st.Cache)
		out.Cache = &c
	}
	httpjson.Write(w, http.StatusOK, out)
}

// canRead reports whether the caller may see an object of the project at display path owner
// that is shared down the tree unless private: with perm on owner, or, from inside owner's
// subtree, with perm on the token's own project.
func (c *caller) canRead(perm iam.Perm, owner string, private bool) bool {
	p, err := iam.ParsePath("project", owner)
	if err != nil {
		return false
	}
	if c.perms(p).Has(perm) {
		return true
	}
	return !private && iam.Within(c.tok.ProjectPath, p) && c.perms(c.tok.ProjectPath).Has(perm)
}

// canReadLayer reports whether the caller may see layer l: with layer.read on its project, or
// from a project that sees it (iam.LayerVisible) with layer.read there.
func (c *caller) canReadLayer(l model.Layer) bool {
	owner, err := iam.ParsePath("project", l.Project)
	if err != nil {
		return false
	}
	if c.perms(owner).Has(iam.LayerRead) {
		return true
	}
	return iam.LayerVisible(owner, l.Private, l.Public, c.tok.ProjectPath) && c.perms(c.tok.ProjectPath).Has(iam.LayerRead)
}

// layerNotFound is the answer for a layer the caller does not see: word for word the store's
// answer for one that does not exist, so it tells nothing of other projects' layers.
func layerNotFound(name, version string) error {
	return errdefs.NotFound("layer %s:%s", name, version)
}

// onEnvironment resolves to the project of the environment in the path. Readers from inside
// the project's subtree resolve to their own scope, since environments are shared down.
func (s *Server) onEnvironment(read bool) resolver {
	return func(r *http.Request) (string, string, error) {
		name := r.PathValue("name")
		env, err := s.store.GetEnvironment(r.Context(), name)
		if err != nil {
			return "", name, err
		}
		p, err := iam.ParsePath("project", env.Project)
		if scope := who(r).tok.ProjectPath; read && err == nil && iam.Within(scope, p) {
			p = scope
		}
		return p, name, err
	}
}

// onLayerName resolves to the project that owns the layer name in the path.
func (s *Server) onLayerName(r *http.Request) (string, string, error) {
	name := r.PathValue("name")
	ls, err := s.catalogue().LayerVersions(r.Context(), name)
	if err != nil {
		return "", name, err
	}
	target := name + ":" + r.PathValue("version") + r.PathValue("tag")
	// A caller who sees no version of the name is told it does not exist (the answer for a name
	// nobody published), not that it lacks a permission on a project it cannot see.
	if !slices.ContainsFunc(ls, who(r).canReadLayer) {
		return "", target, errdefs.NotFound("layer %s", name)
	}
	p, err := iam.ParsePath("project", ls[0].Project)
	return p, target, err
}

// onQueryProject resolves to the project in a query parameter (the caller's scope when absent);
// target is another query parameter.
func (s *Server) onQueryProject(param, target string) resolver {
	return func(r *http.Request) (string, string, error) {
		p, err := who(r).project(param, r.URL.Query().Get(param))
		return p, r.URL.Query().Get(target), err
	}
}

// onFncall resolves to the project of the fncall environment in the path.
func (s *Server) onFncall(r *http.Request) (string, string, error) {
	name := r.PathValue("name")
	project, err := s.environments.FncallProject(r.Context(), name)
	if err != nil {
		return "", name, err
	}
	p, err := iam.ParsePath("project", project)
	return p, name, err
}
