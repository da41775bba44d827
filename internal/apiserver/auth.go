package apiserver

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/edge"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/nodeproto"
	"github.com/corral-dev/corral/internal/store"
)

// caller is who sent a request: the token and the grants its principal holds where the token
// reaches.
type caller struct {
	tok *store.TokenRecord
	// held maps a canonical project path to the permissions the principal's grants there give.
	held map[string]iam.Perm
	// sandbox, on a cluster's edge, is the sandbox the request's path names and its project as
	// the server read it (nil when the server did not).
	sandbox *nodeproto.SandboxProject
}

type callerKey struct{}

// who returns the caller of an authenticated request.
func who(r *http.Request) *caller {
	return r.Context().Value(callerKey{}).(*caller)
}

// perms returns what the caller may do on the project at canonical path p: nothing outside the
// token's scope; inside it, the token's permissions that a grant on p or an ancestor backs.
func (c *caller) perms(p string) iam.Perm {
	if !iam.Within(p, c.tok.ProjectPath) {
		return 0
	}
	var held iam.Perm
	for _, a := range iam.Ancestors(p) {
		held |= c.held[a]
	}
	return held & c.tok.Perms
}

// require fails with a DeniedError unless the caller holds every permission of perm on p.
func (c *caller) require(perm iam.Perm, p string) error {
	have := c.perms(p)
	if have.Has(perm) {
		return nil
	}
	missing := perm &^ have
	d := &iam.DeniedError{Perm: missing, Project: p}
	switch {
	case !iam.Within(p, c.tok.ProjectPath):
		d.Why = "the target is outside the token's scope " + iam.Display(c.tok.ProjectPath)
		// Naming a project the caller cannot see would tell it what is there, unless the
		// caller named it itself (it is an ancestor of the scope).
		d.Hidden = !iam.Within(c.tok.ProjectPath, p)
	case !c.tok.Perms.Has(missing):
		d.Why = "the token does not carry it"
	default:
		d.Why = "principal " + c.tok.Principal + " holds no role with it there"
	}
	return d
}

// authenticate checks the bearer token of every request and puts its caller in the context.
// Unknown, revoked and expired tokens get 401; nothing about the token is cached, so a
// revocation holds from the next request on.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var c *caller
		var err error
		if s.servesNodes {
			c, err = nodeCaller(r)
		} else {
			c, err = s.caller(r.Context(), bearer(r))
		}
		if err != nil {
			if errors.Is(err, errdefs.ErrUnauthorized) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="corral", error="invalid_token"`)
			}
			httpjson.Error(w, r, s.log, err)
			return
		}
		ctx := context.WithValue(r.Context(), callerKey{}, c)
		if s.servesNodes {
			// What this request makes the edge admit goes with the caller the server sealed.
			ctx = nodeproto.WithVoucher(ctx, nodeproto.VoucherOf(r.Header))
			ctx = nodeproto.WithResolution(ctx, nodeproto.ResolutionOf(r.Header))
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// bearer returns the request's Authorization header or, on a WebSocket upgrade without one, the
// token a browser offered as a subprotocol (model.WebSocketBearerProtocol), as a header value.
// The token's subprotocol is removed from the request either way, so it never travels further
// as one (to a port inside a sandbox, say) nor is answered back.
func bearer(r *http.Request) string {
	header := r.Header.Get("Authorization")
	if len(r.Header.Values("Sec-WebSocket-Protocol")) == 0 {
		return header
	}
	var keep []string
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			p = strings.TrimSpace(p)
			enc, ok := strings.CutPrefix(p, model.WebSocketBearerProtocol)
			if !ok {
				if p != "" {
					keep = append(keep, p)
				}
				continue
			}
			tok, err := base64.RawURLEncoding.DecodeString(enc)
			if header == "" && err == nil && strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
				// Set as the header too, as the token of the request; a cluster server sends
				// the edge the caller instead, and a port proxy drops it as it drops any token.
				header = "Bearer " + string(tok)
				r.Header.Set("Authorization", header)
			}
		}
	}
	r.Header.Del("Sec-WebSocket-Protocol")
	if len(keep) > 0 {
		r.Header.Set("Sec-WebSocket-Protocol", strings.Join(keep, ", "))
	}
	return header
}

// Authenticated serves next to requests with a valid token, the caller in their context (for
// Require); the cluster server uses it for its own routes.
func (s *Server) Authenticated(next http.Handler) http.Handler { return s.authenticate(next) }

// Require fails unless the caller of an Authenticated request holds perm on the project at the
// canonical path project.
func Require(r *http.Request, perm iam.Perm, project string) error {
	return who(r).require(perm, project)
}

// CallerProject returns the canonical path of the project an Authenticated request names in
// field (a path), or its token's project when path is empty.
func CallerProject(r *http.Request, field, path string) (string, error) {
	return who(r).project(field, path)
}

func (s *Server) caller(ctx context.Context, header string) (*caller, error) {
	token, err := iam.ParseBearer(header)
	if err != nil {
		return nil, err
	}
	t, err := s.store.TokenByHash(ctx, HashToken(token))
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, fmt.Errorf("invalid token: %w", errdefs.ErrUnauthorized)
	} else if err != nil {
		return nil, err
	}
	switch {
	case !t.RevokedAt.IsZero():
		return nil, fmt.Errorf("token %s was revoked at %s: %w", t.ID, t.RevokedAt.Format(time.RFC3339), errdefs.ErrUnauthorized)
	case !t.ExpiresAt.IsZero() && !time.Now().Before(t.ExpiresAt):
		return nil, fmt.Errorf("token %s expired at %s: %w", t.ID, t.ExpiresAt.Format(time.RFC3339), errdefs.ErrUnauthorized)
	}
	grants, err := s.store.PrincipalGrants(ctx, t.Principal, t.ProjectPath)
	if err != nil {
		return nil, err
	}
	c := &caller{tok: t, held: make(map[string]iam.Perm, len(grants))}
	for _, g := range grants {
		p, _ := iam.RolePerms(g.Role)
		c.held[g.ProjectPath] |= p
	}
	return c, nil
}

// nodeCaller returns the caller a cluster server authenticated and sent with r, on an edge.
func nodeCaller(r *http.Request) (*caller, error) {
	nc, err := nodeproto.CallerOf(r)
	if err != nil {
		return nil, err
	}
	r.Header.Del("Authorization") // none comes from a server; none goes further if one did
	return callerOf(nc), nil
}

// callerOf is the caller a server sent.
func callerOf(nc *nodeproto.Caller) *caller {
	return &caller{
		tok: &store.TokenRecord{ID: nc.TokenID, Principal: nc.Principal, ProjectID: nc.ProjectID, ProjectPath: nc.ProjectPath,
			Perms: nc.Perms, Role: nc.Role, Parent: nc.Parent, CreatedAt: nc.CreatedAt, ExpiresAt: nc.ExpiresAt},
		held:    nc.Held,
		sandbox: nc.Sandbox,
	}
}

// ForwardCaller makes h, an Authenticated request's header on its way to node's edge, carry its
// caller for the edge instead of the user's token (the token stays here), sealed by s
// (nodeproto.SetSealedCaller; nil: unsealed) for as long as r's work needs it
// (nodeproto.VoucherTTLFor).
func ForwardCaller(r *http.Request, h http.Header, node string, s *nodeproto.Sealer) error {
	c := who(r)
	h.Del("Authorization")
	sb, _ := r.Context().Value(sandboxKey{}).(*nodeproto.SandboxProject)
	return nodeproto.SetSealedCaller(h, &nodeproto.Caller{
		TokenID: c.tok.ID, Principal: c.tok.Principal, ProjectID: c.tok.ProjectID, ProjectPath: c.tok.ProjectPath,
		Perms: c.tok.Perms, Role: c.tok.Role, Parent: c.tok.Parent, CreatedAt: c.tok.CreatedAt, ExpiresAt: c.tok.ExpiresAt,
		Held: c.held, Sandbox: sb,
	}, node, s, nodeproto.VoucherTTLFor(r.Method, r.URL.Path))
}

// CallerMay fails with a DeniedError unless the caller a server sent an edge holds perm on the
// project at path p (canonical), as the edge would check it.
func CallerMay(nc *nodeproto.Caller, perm iam.Perm, p string) error {
	return callerOf(nc).require(perm, p)
}

// CallerCanReadLayer reports whether nc, a caller a replica sealed for an edge, can read layer
// l (as GET /v1/layers lists it for that caller).
func CallerCanReadLayer(nc *nodeproto.Caller, l model.Layer) bool {
	return callerOf(nc).canReadLayer(l)
}

type sandboxKey struct{}

// OnSandbox returns r knowing the canonical path of the project of sandbox id, which r's path
// names, as the server just read it: ForwardCaller sends it to the edge with the caller.
func OnSandbox(r *http.Request, id, project string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), sandboxKey{}, &nodeproto.SandboxProject{ID: id, Project: project}))
}

// project returns the canonical path named by a request field, or the caller's scope when empty.
func (c *caller) project(field, path string) (string, error) {
	if path == "" {
		return c.tok.ProjectPath, nil
	}
	return iam.ParsePath(field, path)
}

// statusRecorder remembers the status a handler answered with, for the audit log.
type statusRecorder struct {
	http.ResponseWriter
	status int
	err    error // what the handler failed with, when it did through Server.fail
}

func (w *statusRecorder) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush lets streaming handlers flush through the recorder.
func (w *statusRecorder) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// audit records one management action. Failing to write the entry is logged, not returned: the
// action has already happened. Refusals are recorded at most refusalBurst at once and
// refusalRate a second per token, so a token cannot flood the log (and the store's one writer)
// by asking for what it may not do; what is left out is counted in the server log.
func (s *Server) audit(r *http.Request, action, project, target string, err error, detail string) {
	result := "ok"
	if err != nil {
		result = errdefs.Code(err)
		if detail == "" {
			detail = err.Error()
		}
	}
	s.auditResult(r, action, project, target, result, detail)
}

// auditResult is audit with the result code given ("ok", "denied", ...).
func (s *Server) auditResult(r *http.Request, action, project, target, result, detail string) {
	c := who(r)
	if result != "ok" {
		if result == model.CodeDenied || result == model.CodeInvalid || result == model.CodeNotFound {
			if !s.refusals.allow(c.tok.ID, time.Now()) {
				return
			}
		}
	}
	e := model.AuditEntry{
		At: time.Now().UTC(), Principal: c.tok.Principal, Token: c.tok.ID, Project: project,
		Action: action, Target: target, Result: result, Detail: detail,
	}
	e.Detail, e.Target = CutAudit(e.Detail, MaxAuditDetail), CutAudit(e.Target, MaxAuditTarget)
	if werr := s.auditor.AddAudit(context.WithoutCancel(r.Context()), e, c.tok.ProjectPath); werr != nil {
		s.log.Error("write audit entry", "action", action, "target", target, "err", werr)
	}
}

// Bounds of an audit entry's free text.
const (
	MaxAuditDetail = 1024
	MaxAuditTarget = 256
)

// CutAudit cuts s to at most n bytes, at a character's start, so that no character is split
// (a split one would travel as a replacement character, longer than the bytes it replaced).
func CutAudit(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Refusals each token may have audited: a burst, then a steady rate.
const (
	refusalBurst = 20
	refusalRate  = 5 // per second
)

// refusalLimiter is a token bucket of audited refusals per API token.
type refusalLimiter struct {
	mu      sync.Mutex
	buckets map[string]*refusalBucket
	dropped int64
}

type refusalBucket struct {
	left float64
	at   time.Time
}

func (l *refusalLimiter) allow(token string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buckets == nil || len(l.buckets) > 10000 {
		l.buckets = map[string]*refusalBucket{}
	}
	b, ok := l.buckets[token]
	if !ok {
		b = &refusalBucket{left: refusalBurst, at: now}
		l.buckets[token] = b
	}
	b.left = min(refusalBurst, b.left+now.Sub(b.at).Seconds()*refusalRate)
	b.at = now
	if b.left < 1 {
		l.dropped++
		return false
	}
	b.left--
	return true
}

// resolver names the project (canonical path) a request acts on, and its target for the audit.
type resolver func(r *http.Request) (project, target string, err error)

// onSandbox resolves to the project of the sandbox in the request's path.
func (s *Server) onSandbox(r *http.Request) (string, string, error) {
	id := r.PathValue("id")
	if !edge.ValidID(id) {
		return "", id, errdefs.Invalid("id", "%q is not a sandbox ID (sb-NODE-XXXXXXXXXXXXXXXX)", id)
	}
	var p string
	var err error
	switch sb := who(r).sandbox; {
	case sb != nil && sb.ID == id:
		p = sb.Project // a cluster's server read it for this request
	case s.store == nil:
		// A cluster's edge, asked about a sandbox its server sent nothing of: its own record.
		var rec *store.Sandbox
		if rec, err = s.edge.Get(r.Context(), id); err == nil {
			p, err = iam.ParsePath("project", rec.Project)
		}
	default:
		p, err = s.store.SandboxProject(r.Context(), id)
	}
	if err == nil && s.edge != nil {
		s.edge.NoteProject(id, p)
	}
	return p, id, err
}

// operator resolves to the root project: installation-wide settings.
func operator(r *http.Request) (string, string, error) { return "", "", nil }

// guard serves h only when the caller holds perm on the project resolve names. With an action,
// the outcome (refusals included) goes to the audit log.
func (s *Server) guard(perm iam.Perm, action string, resolve resolver, h http.HandlerFunc) http.HandlerFunc {
	return s.guardIn(perm, action, resolve, func(w http.ResponseWriter, r *http.Request, _ string) { h(w, r) })
}

// guardIn is guard for a handler that uses the project (canonical) the caller was checked in.
func (s *Server) guardIn(perm iam.Perm, action string, resolve resolver, h func(w http.ResponseWriter, r *http.Request, project string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		project, target, err := resolve(r)
		if err == nil {
			err = who(r).require(perm, project)
		}
		if err != nil {
			if action != "" {
				s.audit(r, action, project, target, err, "")
			}
			s.fail(w, r, err)
			return
		}
		if action == "" {
			h(w, r, project)
			return
		}
		rec := &statusRecorder{ResponseWriter: w}
		h(rec, r, project)
		if rec.err == nil && rec.status >= 400 {
			// Failed without Server.fail (a handler that wrote its error itself): the status
			// says what kind of failure it was.
			s.auditResult(r, action, project, target, errdefs.Code(errdefs.KindOf(rec.status)), http.StatusText(rec.status))
			return
		}
		s.audit(r, action, project, target, rec.err, "")
	}
}

// Prune removes, every hour until ctx ends, audit entries older than retention and create
// idempotency keys older than a day.
func (s *Server) Prune(ctx context.Context, retention time.Duration) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		if n, err := s.store.PruneAudit(ctx, time.Now().Add(-retention)); err != nil {
			s.log.Warn("prune the audit log", "err", err)
		} else if n > 0 {
			s.log.Info("pruned the audit log", "entries", n, "retention", retention)
		}
		if _, err := s.store.PruneIdempotency(ctx); err != nil {
			s.log.Warn("prune idempotency keys", "err", err)
		}
		// Events and webhook deliveries are kept a week; usage rows (the report) as long as the audit log.
		if err := s.store.PruneObservations(ctx, time.Now().Add(-7*24*time.Hour), time.Now().Add(-retention)); err != nil {
			s.log.Warn("prune events and usage", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
