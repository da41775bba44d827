package corraltest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// The fake's identity model is simpler than the real server's: a request may do what its token
// allows (the token's permissions, in its project's subtree), and grants are only recorded,
// never consulted. That is enough for clients to see every answer the real server gives (a 403
// naming the missing permission, a 429 naming the quota) without re-implementing it.

// adminTokenID is the ID of the record of [Server.Token], whose secret is read from that field.
const adminTokenID = "tok-admin"

// iamState is the fake's projects, principals, grants, tokens and audit log. All fields are
// protected by Server.mu.
type iamState struct {
	projects       map[string]*project // by path; "/" always exists
	principals     map[string]*corral.Principal
	principalOrder []string
	grants         []corral.Grant
	tokens         map[string]*token // by ID
	tokenOrder     []string
	audit          []corral.AuditEntry
	next           int // numbers project, token and generated principal names
}

type project struct {
	info  corral.Project // Sandboxes is counted when the project is shown
	limit corral.Quota
}

type token struct {
	info   corral.Token // Token (the secret) is empty
	secret string       // empty for the administrator's, which is Server.Token
}

// refusal is a 403 that names the missing permission or a 429 that names the quota: the two
// errors whose JSON body carries more than httpError does.
type refusal struct {
	status int
	body   corral.Error
}

func refuse(w http.ResponseWriter, e *refusal) { writeJSON(w, e.status, e.body) }

func denied(perm, format string, args ...any) *refusal {
	return &refusal{http.StatusForbidden, corral.Error{Code: corral.CodeDenied, Message: fmt.Sprintf(format, args...), Permission: perm}}
}

// rolePermissions lists each role's permissions, in the order of the constants.
var rolePermissions = func() map[string][]string {
	viewer := []string{corral.PermSandboxRead, corral.PermLayerRead, corral.PermProjectRead}
	user := append(slices.Clone(viewer), corral.PermSandboxCreate, corral.PermSandboxUse)
	admin := append(slices.Clone(user), corral.PermSandboxAdmin, corral.PermLayerPublish, corral.PermProjectCreate,
		corral.PermQuotaDelegate, corral.PermAuditRead)
	owner := append(slices.Clone(admin), corral.PermProjectGrant, corral.PermOperator)
	return map[string][]string{corral.RoleViewer: viewer, corral.RoleUser: user, corral.RoleAdmin: admin, corral.RoleOwner: owner}
}()

// permissionsOf returns the permissions role gives on project (operator only on the root).
func permissionsOf(role, project string) []string {
	perms := slices.Clone(rolePermissions[role])
	if project != corral.RootProject {
		perms = slices.DeleteFunc(perms, func(p string) bool { return p == corral.PermOperator })
	}
	return perms
}

// initIAMLocked creates the root project and the administrator with its token.
//
// Preconditions: s.mu is held (or s is not yet shared).
func (s *Server) initIAMLocked() {
	now := timeNow()
	s.iam = iamState{
		projects:   map[string]*project{corral.RootProject: {info: corral.Project{ID: "prj-root", Path: corral.RootProject, CreatedAt: now, CreatedBy: "admin"}}},
		principals: map[string]*corral.Principal{"admin": {Name: "admin", Kind: corral.KindUser, Project: corral.RootProject, CreatedAt: now}},
		tokens: map[string]*token{adminTokenID: {info: corral.Token{ID: adminTokenID, Principal: "admin", Project: corral.RootProject,
			Role: corral.RoleOwner, Permissions: permissionsOf(corral.RoleOwner, corral.RootProject), CreatedAt: now}}},
		principalOrder: []string{"admin"},
		tokenOrder:     []string{adminTokenID},
	}
	s.iam.grants = []corral.Grant{{Project: corral.RootProject, Principal: "admin", Role: corral.RoleOwner, CreatedAt: now}}
}

// callerLocked returns the live token the request's bearer token is, and whether there is one.
//
// Preconditions: s.mu is held.
func (s *Server) callerLocked(r *http.Request) (*token, bool) {
	secret, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || secret == "" {
		return nil, false
	}
	var t *token
	if secret == s.Token {
		t = s.iam.tokens[adminTokenID]
	} else {
		for _, id := range s.iam.tokenOrder {
			if s.iam.tokens[id].secret == secret {
				t = s.iam.tokens[id]
			}
		}
	}
	if t == nil || t.info.RevokedAt != nil || (t.info.ExpiresAt != nil && !timeNow().Before(*t.info.ExpiresAt)) {
		return nil, false
	}
	return t, true
}

// allowLocked checks that the caller's token holds perm and reaches project.
//
// Preconditions: s.mu is held; the request was authenticated.
func (s *Server) allowLocked(r *http.Request, perm, project string) *refusal {
	t, _ := s.callerLocked(r)
	if t == nil {
		return denied(perm, "no token")
	}
	if !within(project, t.info.Project) {
		return denied(perm, "the token acts in project %s only, not %s", t.info.Project, project)
	}
	if !slices.Contains(t.info.Permissions, perm) {
		return denied(perm, "permission %s on project %s is missing", perm, project)
	}
	return nil
}

// auditLocked records a successful management action of the caller.
//
// Preconditions: s.mu is held.
func (s *Server) auditLocked(r *http.Request, action, project, target, detail string) {
	e := corral.AuditEntry{ID: int64(len(s.iam.audit) + 1), At: timeNow(), Project: project, Action: action,
		Target: target, Result: "ok", Detail: detail}
	if t, ok := s.callerLocked(r); ok {
		e.Principal, e.Token = t.info.Principal, t.info.ID
	}
	s.iam.audit = append(s.iam.audit, e)
}

// projectArg turns a project path from a client into its canonical form ("/", "a/b").
func projectArg(field, p string) (string, *httpError) {
	p = strings.Trim(p, "/")
	if p == "" {
		return corral.RootProject, nil
	}
	for name := range strings.SplitSeq(p, "/") {
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, " \t\n:") {
			return "", invalid(field, "project path %q: want slash-separated names (team-a/rollout-17)", p)
		}
	}
	return p, nil
}

// parentOf returns a project's parent path; "" for the root.
func parentOf(p string) string {
	if p == corral.RootProject {
		return ""
	}
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return corral.RootProject
}

// within reports whether p is ancestor or in its subtree.
func within(p, ancestor string) bool {
	return ancestor == corral.RootProject || p == ancestor || strings.HasPrefix(p, ancestor+"/")
}

// live reports whether a sandbox counts against quotas.
func live(sb *sandbox) bool {
	return sb.state == corral.StateCreating || sb.state == corral.StateRunning || sb.state == corral.StatePaused || sb.state == corral.StateOff
}

// projectViewLocked returns a project with its live sandboxes counted.
//
// Preconditions: s.mu is held.
func (s *Server) projectViewLocked(p *project) corral.Project {
	v := p.info
	for _, sb := range s.sandboxes {
		if live(sb) && sb.spec.Project == v.Path {
			v.Sandboxes++
		}
	}
	return v
}

// callerProjectLocked returns the project of the caller's token.
//
// Preconditions: s.mu is held.
func (s *Server) callerProjectLocked(r *http.Request) string {
	if t, ok := s.callerLocked(r); ok {
		return t.info.Project
	}
	return corral.RootProject
}

func (s *Server) whoami(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, _ := s.callerLocked(r)
	writeJSON(w, http.StatusOK, corral.Whoami{Principal: *s.iam.principals[t.info.Principal], Token: t.info,
		Permissions: t.info.Permissions})
}

func (s *Server) createProject(w http.ResponseWriter, r *http.Request) {
	var req corral.ProjectRequest
	if err := decodeBody(r, &req); err != nil {
		fail(w, err)
		return
	}
	path, err := projectArg("path", req.Path)
	if err != nil {
		fail(w, err)
		return
	}
	if path == corral.RootProject {
		fail(w, conflict("the root project always exists"))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	parent := parentOf(path)
	if e := s.allowLocked(r, corral.PermProjectCreate, parent); e != nil {
		refuse(w, e)
		return
	}
	if _, ok := s.iam.projects[parent]; !ok {
		fail(w, notFound("project %s not found: create the parent first", parent))
		return
	}
	if _, ok := s.iam.projects[path]; ok {
		fail(w, conflict("project %s already exists", path))
		return
	}
	s.iam.next++
	t, _ := s.callerLocked(r)
	p := &project{info: corral.Project{ID: "prj-" + strconv.Itoa(s.iam.next), Path: path, Parent: parent, CreatedAt: timeNow(),
		CreatedBy: t.info.Principal}}
	s.iam.projects[path] = p
	s.auditLocked(r, "project.create", path, path, "")
	writeJSON(w, http.StatusCreated, p.info)
}

func (s *Server) listProjects(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	under := s.callerProjectLocked(r)
	if u := r.URL.Query().Get("under"); u != "" {
		var err *httpError
		if under, err = projectArg("under", u); err != nil {
			fail(w, err)
			return
		}
		if e := s.allowLocked(r, corral.PermProjectRead, under); e != nil {
			refuse(w, e)
			return
		}
	}
	if _, ok := s.iam.projects[under]; !ok {
		fail(w, notFound("project %s not found", under))
		return
	}
	var paths []string
	for p := range s.iam.projects {
		if within(p, under) {
			paths = append(paths, p)
		}
	}
	// Sorted by path with the root first, a parent comes before its children.
	slices.SortFunc(paths, func(a, b string) int {
		if (a == corral.RootProject) != (b == corral.RootProject) {
			if a == corral.RootProject {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	out := []corral.Project{}
	for _, p := range paths {
		out = append(out, s.projectViewLocked(s.iam.projects[p]))
	}
	writeJSON(w, http.StatusOK, out)
}

// pathProjectLocked returns the project named by the request's {path...}.
//
// Preconditions: s.mu is held.
func (s *Server) pathProjectLocked(r *http.Request) (*project, *httpError) {
	path, err := projectArg("path", r.PathValue("path"))
	if err != nil {
		return nil, err
	}
	p, ok := s.iam.projects[path]
	if !ok {
		return nil, notFound("project %s not found", path)
	}
	return p, nil
}

func (s *Server) getProject(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := s.pathProjectLocked(r)
	if err != nil {
		fail(w, err)
		return
	}
	if e := s.allowLocked(r, corral.PermProjectRead, p.info.Path); e != nil {
		refuse(w, e)
		return
	}
	writeJSON(w, http.StatusOK, s.projectViewLocked(p))
}

// liveInLocked returns the live sandboxes in subtree.
//
// Preconditions: s.mu is held.
func (s *Server) liveInLocked(subtree string) []*sandbox {
	var out []*sandbox
	for _, id := range s.sbOrder {
		if sb := s.sandboxes[id]; live(sb) && within(sb.spec.Project, subtree) {
			out = append(out, sb)
		}
	}
	return out
}

func (s *Server) deleteProject(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := s.pathProjectLocked(r)
	if err != nil {
		fail(w, err)
		return
	}
	path := p.info.Path
	if path == corral.RootProject {
		fail(w, invalid("path", "the root project cannot be deleted"))
		return
	}
	if e := s.allowLocked(r, corral.PermProjectCreate, parentOf(path)); e != nil {
		refuse(w, e)
		return
	}
	sbs := s.liveInLocked(path)
	if len(sbs) > 0 && r.URL.Query().Get("force") != "true" {
		fail(w, conflict("project %s has %d live sandboxes: delete them first, or force", path, len(sbs)))
		return
	}
	for _, sb := range sbs {
		sb.state, sb.reason = corral.StateStopped, corral.ReasonDeleted
		sb.spec.EndedAt = timeNow()
		sb.cancel()
	}
	for q := range s.iam.projects {
		if within(q, path) {
			delete(s.iam.projects, q)
		}
	}
	s.iam.grants = slices.DeleteFunc(s.iam.grants, func(g corral.Grant) bool { return within(g.Project, path) })
	s.iam.principalOrder = slices.DeleteFunc(s.iam.principalOrder, func(name string) bool {
		if within(s.iam.principals[name].Project, path) {
			delete(s.iam.principals, name)
			return true
		}
		return false
	})
	now := timeNow()
	for _, t := range s.iam.tokens {
		if within(t.info.Project, path) && t.info.RevokedAt == nil {
			t.info.RevokedAt = &now
		}
	}
	s.auditLocked(r, "project.delete", path, path, "")
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) moveProject(w http.ResponseWriter, r *http.Request) {
	var req corral.MoveProjectRequest
	if err := decodeBody(r, &req); err != nil {
		fail(w, err)
		return
	}
	from, err := projectArg("from", req.From)
	if err != nil {
		fail(w, err)
		return
	}
	to, err := projectArg("to", req.To)
	if err != nil {
		fail(w, err)
		return
	}
	switch {
	case from == corral.RootProject || to == corral.RootProject:
		fail(w, invalid("from", "the root project cannot be moved or replaced"))
		return
	case within(to, from):
		fail(w, invalid("to", "cannot move project %s into its own subtree (%s)", from, to))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range []string{parentOf(from), parentOf(to)} {
		if e := s.allowLocked(r, corral.PermProjectCreate, p); e != nil {
			refuse(w, e)
			return
		}
	}
	if _, ok := s.iam.projects[from]; !ok {
		fail(w, notFound("project %s not found", from))
		return
	}
	if _, ok := s.iam.projects[to]; ok {
		fail(w, conflict("project %s already exists", to))
		return
	}
	if _, ok := s.iam.projects[parentOf(to)]; !ok {
		fail(w, notFound("project %s not found: create the parent first", parentOf(to)))
		return
	}
	if n := len(s.liveInLocked(from)); n > 0 && !req.Force {
		fail(w, conflict("project %s has %d live sandboxes: delete them first, or force", from, n))
		return
	}
	moved := func(p string) string {
		if within(p, from) {
			return to + strings.TrimPrefix(p, from)
		}
		return p
	}
	projects := make(map[string]*project, len(s.iam.projects))
	for path, p := range s.iam.projects {
		if within(path, from) {
			p.info.Path = moved(path)
			p.info.Parent = parentOf(p.info.Path)
		}
		projects[p.info.Path] = p
	}
	s.iam.projects = projects
	for _, sb := range s.sandboxes {
		sb.spec.Project = moved(sb.spec.Project)
	}
	for i := range s.iam.grants {
		s.iam.grants[i].Project = moved(s.iam.grants[i].Project)
	}
	for _, p := range s.iam.principals {
		p.Project = moved(p.Project)
	}
	for _, t := range s.iam.tokens {
		t.info.Project = moved(t.info.Project)
	}
	s.auditLocked(r, "project.move", to, from, "to "+to)
	writeJSON(w, http.StatusOK, s.projectViewLocked(s.iam.projects[to]))
}

// usageLocked returns what subtree uses now.
//
// Preconditions: s.mu is held.
func (s *Server) usageLocked(subtree string) corral.Usage {
	var u corral.Usage
	since := timeNow().Add(-time.Minute)
	for _, sb := range s.sandboxes {
		if !within(sb.spec.Project, subtree) {
			continue
		}
		if sb.spec.CreatedAt.After(since) {
			u.CreatesPerMinute++
		}
		if !live(sb) {
			continue
		}
		u.Sandboxes++
		u.CPUs += sb.spec.Limits.CPUs
		u.MemoryBytes += sb.spec.Limits.MemoryBytes
		u.DiskBytes += sb.spec.Limits.DiskBytes
		if u.Tiers == nil {
			u.Tiers = map[string]int64{}
		}
		u.Tiers[sb.spec.Tier]++
	}
	return u
}

// quotaLocked returns p's limits, its subtree's usage and its children's limits summed.
//
// Preconditions: s.mu is held.
func (s *Server) quotaLocked(p *project) corral.ProjectQuota {
	q := corral.ProjectQuota{Project: p.info.Path, Limit: p.limit, Usage: s.usageLocked(p.info.Path)}
	addInt := func(sum **int64, v *int64) {
		if v != nil {
			if *sum == nil {
				*sum = new(int64)
			}
			**sum += *v
		}
	}
	d := &q.Delegated
	for _, c := range s.iam.projects {
		if c.info.Parent != p.info.Path {
			continue
		}
		addInt(&d.Sandboxes, c.limit.Sandboxes)
		addInt(&d.MemoryBytes, c.limit.MemoryBytes)
		addInt(&d.DiskBytes, c.limit.DiskBytes)
		addInt(&d.CreatesPerMinute, c.limit.CreatesPerMinute)
		if c.limit.CPUs != nil {
			if d.CPUs == nil {
				d.CPUs = new(float64)
			}
			*d.CPUs += *c.limit.CPUs
		}
		for tier, n := range c.limit.Tiers {
			if d.Tiers == nil {
				d.Tiers = map[string]int64{}
			}
			d.Tiers[tier] += n
		}
	}
	return q
}

func (s *Server) getQuota(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := s.pathProjectLocked(r)
	if err != nil {
		fail(w, err)
		return
	}
	if e := s.allowLocked(r, corral.PermProjectRead, p.info.Path); e != nil {
		refuse(w, e)
		return
	}
	writeJSON(w, http.StatusOK, s.quotaLocked(p))
}

func (s *Server) setQuota(w http.ResponseWriter, r *http.Request) {
	var q corral.Quota
	if err := decodeBody(r, &q); err != nil {
		fail(w, err)
		return
	}
	// As the real server's: each limit named as its field, tiers sorted, then tier names.
	limits := []struct {
		name string
		v    *int64
	}{{"sandboxes", q.Sandboxes}, {"memory_bytes", q.MemoryBytes}, {"disk_bytes", q.DiskBytes},
		{"creates_per_minute", q.CreatesPerMinute}, {"artifact_bytes", q.ArtifactBytes}}
	if q.CPUs != nil && *q.CPUs < 0 {
		fail(w, invalid("cpus", "a limit cannot be negative (%g)", *q.CPUs))
		return
	}
	for _, l := range limits {
		if l.v != nil && *l.v < 0 {
			fail(w, invalid(l.name, "a limit cannot be negative (%d)", *l.v))
			return
		}
	}
	for _, tier := range slices.Sorted(maps.Keys(q.Tiers)) {
		if n := q.Tiers[tier]; n < 0 {
			fail(w, invalid("tiers."+tier, "a limit cannot be negative (%d)", n))
			return
		}
	}
	for tier := range q.Tiers {
		switch tier {
		case "container", "fncall", "microvm", "vm":
		default:
			fail(w, invalid("tiers", "%q is not a tier (container, fncall, microvm, vm)", tier))
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p, err := s.pathProjectLocked(r)
	if err != nil {
		fail(w, err)
		return
	}
	// A project's quota is its parent's to set; the root's, the operator's.
	perm, on := corral.PermQuotaDelegate, parentOf(p.info.Path)
	if on == "" {
		perm, on = corral.PermOperator, corral.RootProject
	}
	if e := s.allowLocked(r, perm, on); e != nil {
		refuse(w, e)
		return
	}
	p.limit = q
	s.auditLocked(r, "quota.set", p.info.Path, p.info.Path, "")
	writeJSON(w, http.StatusOK, s.quotaLocked(p))
}

// admitLocked checks a new sandbox in project against the quotas of the project and its
// ancestors, and refuses it with a 429 naming the quota it would exceed.
//
// Preconditions: s.mu is held.
func (s *Server) admitLocked(project string, lim corral.Limits, tier string) *refusal {
	asFloat := func(v *int64) *float64 {
		if v == nil {
			return nil
		}
		f := float64(*v)
		return &f
	}
	for p := project; p != ""; p = parentOf(p) {
		pr, ok := s.iam.projects[p]
		if !ok {
			continue
		}
		q, u := pr.limit, s.usageLocked(p)
		type check struct {
			resource       string
			limit          *float64
			usage, request float64
		}
		checks := []check{
			{"sandboxes", asFloat(q.Sandboxes), float64(u.Sandboxes), 1},
			{"cpus", q.CPUs, u.CPUs, lim.CPUs},
			{"memory_bytes", asFloat(q.MemoryBytes), float64(u.MemoryBytes), float64(lim.MemoryBytes)},
			{"disk_bytes", asFloat(q.DiskBytes), float64(u.DiskBytes), float64(lim.DiskBytes)},
			{"creates_per_minute", asFloat(q.CreatesPerMinute), float64(u.CreatesPerMinute), 1},
		}
		if n, ok := q.Tiers[tier]; ok {
			checks = append(checks, check{"tiers." + tier, asFloat(&n), float64(u.Tiers[tier]), 1})
		}
		for _, c := range checks {
			if c.limit != nil && c.usage+c.request > *c.limit {
				ex := &corral.QuotaExceeded{Project: p, Resource: c.resource, Limit: *c.limit, Usage: c.usage, Request: c.request}
				return &refusal{http.StatusTooManyRequests, corral.Error{Code: corral.CodeExhausted,
					Message: "quota exceeded", Quota: ex}}
			}
		}
	}
	return nil
}

func (s *Server) createPrincipal(w http.ResponseWriter, r *http.Request) {
	var req corral.Principal
	if err := decodeBody(r, &req); err != nil {
		fail(w, err)
		return
	}
	if !validName(req.Name) {
		fail(w, invalid("name", "principal name %q is empty or contains ':', '/' or spaces", req.Name))
		return
	}
	switch req.Kind {
	case "":
		req.Kind = corral.KindUser
	case corral.KindUser, corral.KindService, corral.KindAgent:
	default:
		fail(w, invalid("kind", "kind %q is not user, service or agent", req.Kind))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.Project == "" {
		req.Project = s.callerProjectLocked(r)
	}
	project, err := projectArg("project", req.Project)
	if err != nil {
		fail(w, err)
		return
	}
	if e := s.allowLocked(r, corral.PermProjectGrant, project); e != nil {
		refuse(w, e)
		return
	}
	if _, ok := s.iam.projects[project]; !ok {
		fail(w, notFound("project %s not found", project))
		return
	}
	if _, ok := s.iam.principals[req.Name]; ok {
		fail(w, conflict("principal %s already exists", req.Name))
		return
	}
	t, _ := s.callerLocked(r)
	p := s.addPrincipalLocked(req.Name, req.Kind, project, t.info.Principal)
	s.auditLocked(r, "principal.create", project, p.Name, "kind "+p.Kind)
	writeJSON(w, http.StatusCreated, p)
}

// addPrincipalLocked records a new principal.
//
// Preconditions: s.mu is held; no principal has this name.
func (s *Server) addPrincipalLocked(name, kind, project, by string) corral.Principal {
	p := &corral.Principal{Name: name, Kind: kind, Project: project, CreatedAt: timeNow(), CreatedBy: by}
	s.iam.principals[name] = p
	s.iam.principalOrder = append(s.iam.principalOrder, name)
	return *p
}

// subtreeLocked returns the project a list route's ?project= names, after checking the caller
// holds perm there; without one, the caller's token's project. It answers the request itself
// when it returns false.
//
// Preconditions: s.mu is held.
func (s *Server) subtreeLocked(w http.ResponseWriter, r *http.Request, perm string) (string, bool) {
	v := r.URL.Query().Get("project")
	if v == "" {
		return s.callerProjectLocked(r), true
	}
	p, err := projectArg("project", v)
	if err != nil {
		fail(w, err)
		return "", false
	}
	if e := s.allowLocked(r, perm, p); e != nil {
		refuse(w, e)
		return "", false
	}
	return p, true
}

func (s *Server) listPrincipals(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	project, ok := s.subtreeLocked(w, r, corral.PermProjectRead)
	if !ok {
		return
	}
	out := []corral.Principal{}
	for _, name := range s.iam.principalOrder {
		if p := s.iam.principals[name]; within(p.Project, project) {
			out = append(out, *p)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// checkRole checks that role is one of the four, as a 400 on field.
func checkRole(field, role string) *httpError {
	if _, ok := rolePermissions[role]; !ok {
		return invalid(field, "role %q is not viewer, user, admin or owner", role)
	}
	return nil
}

// delegableLocked checks that the caller may hand out perms on project: it must hold every one.
//
// Preconditions: s.mu is held.
func (s *Server) delegableLocked(r *http.Request, perms []string, project string) *refusal {
	for _, p := range perms {
		if e := s.allowLocked(r, p, project); e != nil {
			e.body.Message = "cannot give what the caller lacks: " + e.body.Message
			return e
		}
	}
	return nil
}

func (s *Server) createGrant(w http.ResponseWriter, r *http.Request) {
	var req corral.Grant
	if err := decodeBody(r, &req); err != nil {
		fail(w, err)
		return
	}
	project, err := projectArg("project", req.Project)
	if err != nil {
		fail(w, err)
		return
	}
	if err := checkRole("role", req.Role); err != nil {
		fail(w, err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.allowLocked(r, corral.PermProjectGrant, project); e != nil {
		refuse(w, e)
		return
	}
	if e := s.delegableLocked(r, permissionsOf(req.Role, project), project); e != nil {
		refuse(w, e)
		return
	}
	if _, ok := s.iam.projects[project]; !ok {
		fail(w, notFound("project %s not found", project))
		return
	}
	if _, ok := s.iam.principals[req.Principal]; !ok {
		fail(w, &httpError{http.StatusNotFound, corral.CodeNotFound, "principal " + req.Principal + " not found", "principal"})
		return
	}
	for _, g := range s.iam.grants {
		if g.Project == project && g.Principal == req.Principal && g.Role == req.Role {
			writeJSON(w, http.StatusOK, g)
			return
		}
	}
	t, _ := s.callerLocked(r)
	g := corral.Grant{Project: project, Principal: req.Principal, Role: req.Role, CreatedAt: timeNow(), CreatedBy: t.info.Principal}
	s.iam.grants = append(s.iam.grants, g)
	s.auditLocked(r, "grant.create", project, g.Principal, "role "+g.Role)
	writeJSON(w, http.StatusCreated, g)
}

func (s *Server) listGrants(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	project, ok := s.subtreeLocked(w, r, corral.PermProjectRead)
	if !ok {
		return
	}
	out := []corral.Grant{}
	for _, g := range s.iam.grants {
		if within(g.Project, project) {
			out = append(out, g)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteGrant(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	project, err := projectArg("project", q.Get("project"))
	if err != nil {
		fail(w, err)
		return
	}
	principal, role := q.Get("principal"), q.Get("role")
	if role != "" {
		if err := checkRole("role", role); err != nil {
			fail(w, err)
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.allowLocked(r, corral.PermProjectGrant, project); e != nil {
		refuse(w, e)
		return
	}
	n := len(s.iam.grants)
	s.iam.grants = slices.DeleteFunc(s.iam.grants, func(g corral.Grant) bool {
		return g.Project == project && g.Principal == principal && (role == "" || g.Role == role)
	})
	if len(s.iam.grants) == n {
		fail(w, notFound("principal %s has no grant on project %s to revoke", principal, project))
		return
	}
	detail := "role " + role
	if role == "" {
		detail = "every role"
	}
	s.auditLocked(r, "grant.delete", project, principal, detail)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request) {
	var req corral.TokenRequest
	if err := decodeBody(r, &req); err != nil {
		fail(w, err)
		return
	}
	if req.Project == "" {
		fail(w, invalid("project", "project is required: the token acts in its subtree only"))
		return
	}
	project, err := projectArg("project", req.Project)
	if err != nil {
		fail(w, err)
		return
	}
	perms := req.Permissions
	switch {
	case req.Role == "" && len(perms) == 0:
		fail(w, invalid("role", "give a role or permissions"))
		return
	case req.Role != "" && len(perms) > 0:
		fail(w, invalid("permissions", "give a role or permissions, not both"))
		return
	case req.Role != "":
		if err := checkRole("role", req.Role); err != nil {
			fail(w, err)
			return
		}
		perms = permissionsOf(req.Role, project)
	}
	for _, p := range perms {
		if !slices.Contains(rolePermissions[corral.RoleOwner], p) {
			fail(w, invalid("permissions", "permission %q is unknown", p))
			return
		}
	}
	var ttl time.Duration
	if req.TTL != "" {
		if ttl, _ = time.ParseDuration(req.TTL); ttl <= 0 {
			fail(w, invalid("ttl", "ttl %q is not a positive Go duration", req.TTL))
			return
		}
	}
	kind := req.Kind
	switch kind {
	case "", corral.KindUser, corral.KindService, corral.KindAgent:
	default:
		fail(w, invalid("kind", "kind %q is not user, service or agent", kind))
		return
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	caller, _ := s.callerLocked(r)
	if _, ok := s.iam.projects[project]; !ok {
		fail(w, notFound("project %s not found", project))
		return
	}
	if e := s.delegableLocked(r, perms, project); e != nil {
		refuse(w, e)
		return
	}
	principal := caller.info.Principal
	switch {
	case req.Principal != "":
		if _, ok := s.iam.principals[req.Principal]; !ok {
			fail(w, &httpError{http.StatusNotFound, corral.CodeNotFound, "principal " + req.Principal + " not found", "principal"})
			return
		}
		principal = req.Principal
	case kind != "" || req.Name != "":
		if kind == "" {
			kind = corral.KindAgent
		}
		principal = req.Name
		if principal == "" {
			s.iam.next++
			principal = kind + "-" + strconv.Itoa(s.iam.next)
		}
		if !validName(principal) {
			fail(w, invalid("name", "principal name %q contains ':', '/' or spaces", principal))
			return
		}
		if _, ok := s.iam.principals[principal]; ok {
			fail(w, conflict("principal %s already exists", principal))
			return
		}
	}
	if principal != caller.info.Principal {
		if e := s.allowLocked(r, corral.PermProjectGrant, project); e != nil {
			refuse(w, e)
			return
		}
	}
	if _, ok := s.iam.principals[principal]; !ok {
		s.addPrincipalLocked(principal, kind, project, caller.info.Principal)
		if req.Role != "" {
			s.iam.grants = append(s.iam.grants, corral.Grant{Project: project, Principal: principal, Role: req.Role,
				CreatedAt: timeNow(), CreatedBy: caller.info.Principal})
		}
	}

	var secret [16]byte
	rand.Read(secret[:])
	s.iam.next++
	t := &token{secret: "ct_" + hex.EncodeToString(secret[:]), info: corral.Token{
		ID: "tok-" + strconv.Itoa(s.iam.next), Principal: principal, Project: project, Role: req.Role,
		Permissions: slices.Clone(perms), Parent: caller.info.ID, CreatedAt: timeNow(),
	}}
	if ttl > 0 {
		exp := t.info.CreatedAt.Add(ttl)
		t.info.ExpiresAt = &exp
	}
	s.iam.tokens[t.info.ID] = t
	s.iam.tokenOrder = append(s.iam.tokenOrder, t.info.ID)
	s.auditLocked(r, "token.mint", project, t.info.ID, "principal "+principal)
	out := t.info
	out.Token = t.secret
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	caller, _ := s.callerLocked(r)
	out := []corral.Token{}
	for _, id := range s.iam.tokenOrder {
		t := s.iam.tokens[id].info
		if t.Principal == caller.info.Principal || within(t.Project, caller.info.Project) {
			out = append(out, t)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.iam.tokens[r.PathValue("id")]
	if !ok {
		fail(w, notFound("token %s not found", r.PathValue("id")))
		return
	}
	if caller, _ := s.callerLocked(r); t.info.Principal != caller.info.Principal {
		if e := s.allowLocked(r, corral.PermProjectGrant, t.info.Project); e != nil {
			refuse(w, e)
			return
		}
	}
	// Tokens are listed oldest first, so a token's parent is revoked before the token is seen.
	now := timeNow()
	revoked := map[string]bool{t.info.ID: true}
	for _, id := range s.iam.tokenOrder {
		d := s.iam.tokens[id]
		if revoked[d.info.ID] || revoked[d.info.Parent] {
			revoked[d.info.ID] = true
			if d.info.RevokedAt == nil {
				d.info.RevokedAt = &now
			}
		}
	}
	s.auditLocked(r, "token.revoke", t.info.Project, t.info.ID, "")
	writeJSON(w, http.StatusOK, t.info)
}

func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	action := q.Get("action")
	limit, before := 100, int64(0)
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			fail(w, invalid("limit", "limit %q is not a positive number", v))
			return
		}
		limit = n
	}
	if v := q.Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			fail(w, invalid("before", "before %q is not a positive entry ID", v))
			return
		}
		before = n
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	project := s.callerProjectLocked(r)
	if v := q.Get("project"); v != "" {
		var err *httpError
		if project, err = projectArg("project", v); err != nil {
			fail(w, err)
			return
		}
	}
	if e := s.allowLocked(r, corral.PermAuditRead, project); e != nil {
		refuse(w, e)
		return
	}
	out := []corral.AuditEntry{}
	for i := len(s.iam.audit) - 1; i >= 0 && len(out) < limit; i-- {
		e := s.iam.audit[i]
		switch {
		case before > 0 && e.ID >= before,
			!within(e.Project, project),
			action != "" && e.Action != action && !(strings.HasSuffix(action, ".") && strings.HasPrefix(e.Action, action)):
			continue
		}
		out = append(out, e)
	}
	writeJSON(w, http.StatusOK, out)
}
