package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpjson"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// Fleet deletes the sandboxes and volumes of project under, deleted with force, wherever they
// are, and audits each delete where it happens. A volume is named by its own project and name.
type Fleet interface {
	DeleteSandbox(r *http.Request, under, id string) error
}

// SetFleet sets how a forced project delete reaches sandboxes and volumes (a cluster server's
// nodes); New sets the local edge's.
func (s *Server) SetFleet(f Fleet) { s.fleet = f }

// localFleet is the edge in this process.
type localFleet struct{ s *Server }

func (f localFleet) DeleteSandbox(r *http.Request, under, id string) error {
	_, err := f.s.edge.Delete(r.Context(), id)
	f.s.audit(r, "sandbox.delete", under, id, err, "project deleted with force")
	return err
}

// maxTokenTTL bounds how long a minted token may live.
const maxTokenTTL = 366 * 24 * time.Hour

// maxActiveTokens bounds the unrevoked, unexpired tokens of one principal.
const maxActiveTokens = 1000

// iamRoutes adds the identity routes: projects, quotas, principals, grants, tokens, audit.
func (s *Server) iamRoutes(api *http.ServeMux) {
	api.HandleFunc("GET /v1/whoami", s.whoami)
	api.HandleFunc("POST /v1/projects", s.createProject)
	api.HandleFunc("GET /v1/projects", s.listProjects)
	api.HandleFunc("POST /v1/projects/move", s.moveProject)
	api.HandleFunc("GET /v1/projects/{path...}", s.guard(iam.ProjectRead, "", pathProject, func(w http.ResponseWriter, r *http.Request) {
		p, _, _ := pathProject(r)
		list, err := s.store.ListProjects(r.Context(), p)
		if err == nil && len(list) == 0 {
			err = errdefs.NotFound("project %s", iam.Display(p))
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		httpjson.Write(w, http.StatusOK, list[0]) // parents come first: the project itself
	}))
	api.HandleFunc("DELETE /v1/projects/{path...}", s.deleteProject)
	api.HandleFunc("GET /v1/quotas/{path...}", s.guard(iam.ProjectRead, "", pathProject, func(w http.ResponseWriter, r *http.Request) {
		p, _, _ := pathProject(r)
		q, err := s.store.GetQuota(r.Context(), p)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		httpjson.Write(w, http.StatusOK, q)
	}))
	api.HandleFunc("PUT /v1/quotas/{path...}", s.setQuota)
	api.HandleFunc("GET /v1/placement/{path...}", s.guard(iam.ProjectRead, "", pathProject, func(w http.ResponseWriter, r *http.Request) {
		p, _, _ := pathProject(r)
		pl, err := s.store.ProjectPlacement(r.Context(), p)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		httpjson.Write(w, http.StatusOK, pl)
	}))
	api.HandleFunc("PUT /v1/placement/{path...}", s.setPlacement)
	api.HandleFunc("POST /v1/principals", s.createPrincipal)
	api.HandleFunc("GET /v1/principals", s.guard(iam.ProjectRead, "", s.onQueryProject("project", ""),
		listUnder(s, s.store.ListPrincipals, func(p *model.Principal) { p.Project = iam.Display(p.Project) })))
	api.HandleFunc("POST /v1/grants", s.grant)
	api.HandleFunc("DELETE /v1/grants", s.revokeGrant)
	api.HandleFunc("GET /v1/grants", s.guard(iam.ProjectRead, "", s.onQueryProject("project", ""),
		listUnder(s, s.store.ListGrants, func(g *model.Grant) { g.Project = iam.Display(g.Project) })))
	api.HandleFunc("POST /v1/tokens", s.mintToken)
	api.HandleFunc("GET /v1/tokens", s.listTokens)
	api.HandleFunc("DELETE /v1/tokens/{id}", s.revokeToken)
	api.HandleFunc("GET /v1/audit", s.guard(iam.AuditRead, "", s.onQueryProject("project", ""), s.listAudit))
}

// listUnder serves the objects of the subtree of the project in the query (the caller's scope by
// default; its guard checked the right to read it), each shown with display.
func listUnder[T any](s *Server, list func(context.Context, string) ([]T, error), display func(*T)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, _, _ := s.onQueryProject("project", "")(r)
		out, err := list(r.Context(), p)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		for i := range out {
			display(&out[i])
		}
		httpjson.Write(w, http.StatusOK, out)
	}
}

// pathProject resolves to the project path in the URL ("/v1/projects/a/b").
func pathProject(r *http.Request) (string, string, error) {
	p, err := iam.ParsePath("path", r.PathValue("path"))
	return p, iam.Display(p), err
}

func (s *Server) whoami(w http.ResponseWriter, r *http.Request) {
	c := who(r)
	p, err := s.store.GetPrincipal(r.Context(), c.tok.Principal)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	p.Project = iam.Display(p.Project)
	httpjson.Write(w, http.StatusOK, model.Whoami{Principal: *p, Token: c.tok.View(), Permissions: c.perms(c.tok.ProjectPath).Names()})
}

func (s *Server) createProject(w http.ResponseWriter, r *http.Request) {
	var req model.ProjectRequest
	if err := httpjson.Decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	c := who(r)
	p, err := iam.ParsePath("path", req.Path)
	var rec *store.ProjectRecord
	if err == nil {
		parent, ok := iam.Parent(p)
		if !ok {
			err = errdefs.Conflict("the root project exists already")
		} else if err = c.require(iam.ProjectCreate, parent); err == nil {
			rec, err = s.store.CreateProject(r.Context(), p, c.tok.Principal)
		}
	}
	s.audit(r, "project.create", p, iam.Display(p), err, "")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusCreated, rec.View())
}

func (s *Server) listProjects(w http.ResponseWriter, r *http.Request) {
	c := who(r)
	under, err := c.project("under", r.URL.Query().Get("under"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !iam.Within(under, c.tok.ProjectPath) {
		under = c.tok.ProjectPath
	}
	list, err := s.store.ListProjects(r.Context(), under)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []model.Project{}
	for _, p := range list {
		if cp, err := iam.ParsePath("path", p.Path); err == nil && c.perms(cp).Has(iam.ProjectRead) {
			out = append(out, p)
		}
	}
	httpjson.Write(w, http.StatusOK, out)
}

// deleteProject deletes a project's subtree; with force=true its live sandboxes first.
func (s *Server) deleteProject(w http.ResponseWriter, r *http.Request) {
	c := who(r)
	p, _, err := pathProject(r)
	force := r.URL.Query().Get("force") == "true"
	if err == nil {
		parent, ok := iam.Parent(p)
		if !ok {
			err = errdefs.Invalid("path", "the root project cannot be deleted")
		} else {
			err = c.require(iam.ProjectCreate, parent)
		}
	}
	if err == nil && force {
		// Deleting the sandboxes needs the right to delete them.
		if err = c.require(iam.SandboxAdmin, p); err == nil {
			err = s.deleteSandboxesUnder(r, p)
		}
		if err == nil {
			err = s.deleteVolumesUnder(r, p)
		}
	}
	if err == nil {
		err = s.store.DeleteProject(r.Context(), p)
		if errors.Is(err, errdefs.ErrConflict) && !force && strings.Contains(err.Error(), "live sandboxes") {
			err = errdefs.Conflict("%v (or delete with force, which deletes them)", strings.TrimPrefix(err.Error(), "delete project "+iam.Display(p)+": "))
		}
	}
	s.audit(r, "project.delete", p, iam.Display(p), err, map[bool]string{true: "force", false: ""}[force])
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) deleteSandboxesUnder(r *http.Request, p string) error {
	ids, err := s.store.LiveSandboxesUnder(r.Context(), p)
	if err != nil {
		return err
	}
	if len(ids) > 0 && s.fleet == nil {
		return errdefs.Unavailable("project %s has %d live sandboxes and this API reaches no node to delete them", iam.Display(p), len(ids))
	}
	for _, id := range ids {
		if err := s.fleet.DeleteSandbox(r, p, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
	}
	return nil
}

// deleteVolumesUnder deletes the volumes of p's subtree (their sandboxes are gone already).
func (s *Server) deleteVolumesUnder(r *http.Request, p string) error {
	vs, err := s.store.ListVolumes(r.Context(), p, "")
	if err != nil {
		return err
	}
	for _, v := range vs {
		_, err := s.volumes.DeleteVolume(r, v.Project, v.Name)
		s.audit(r, "volume.delete", p, v.Name, err, "project deleted with force")
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
	}
	return nil
}

func (s *Server) moveProject(w http.ResponseWriter, r *http.Request) {
	var req model.MoveProjectRequest
	if err := httpjson.Decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	c := who(r)
	from, err := iam.ParsePath("from", req.From)
	var to string
	if err == nil {
		to, err = iam.ParsePath("to", req.To)
	}
	var rec *store.ProjectRecord
	if err == nil {
		fromParent, ok := iam.Parent(from)
		toParent, ok2 := iam.Parent(to)
		switch {
		case !ok:
			err = errdefs.Invalid("from", "the root project cannot be moved")
		case !ok2:
			err = errdefs.Invalid("to", "the root project exists already")
		default:
			// Both ends must be the caller's to change: a move cannot carry a project out of reach.
			if err = c.require(iam.ProjectCreate, fromParent); err == nil {
				err = c.require(iam.ProjectCreate, toParent)
			}
		}
		if err == nil {
			rec, err = s.store.MoveProject(r.Context(), from, to, req.Force)
		}
	}
	s.audit(r, "project.move", from, iam.Display(from)+" -> "+iam.Display(to), err, "")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, rec.View())
}

// setQuota sets a project's limits. The right to do so is quota.delegate on the parent (operator
// on the root for the root's own): a project never raises its own quota.
func (s *Server) setQuota(w http.ResponseWriter, r *http.Request) {
	c := who(r)
	p, _, err := pathProject(r)
	var q model.Quota
	if err == nil {
		err = httpjson.Decode(r, &q)
	}
	var out *model.ProjectQuota
	if err == nil {
		if parent, ok := iam.Parent(p); ok {
			err = c.require(iam.QuotaDelegate, parent)
		} else {
			err = c.require(iam.Operator, "")
		}
	}
	if err == nil {
		out, err = s.store.SetQuota(r.Context(), p, q)
	}
	s.audit(r, "quota.set", p, iam.Display(p), err, quotaDetail(q))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, out)
}

// setPlacement sets the node groups a project is pinned to or kept off. Only operators may: the
// placement bounds a tenant's blast radius, so no project sets its own.
func (s *Server) setPlacement(w http.ResponseWriter, r *http.Request) {
	p, _, err := pathProject(r)
	var pl model.ProjectPlacement
	if err == nil {
		err = httpjson.Decode(r, &pl)
	}
	if err == nil {
		err = who(r).require(iam.Operator, "")
	}
	var out *model.ProjectPlacement
	if err == nil {
		out, err = s.store.SetProjectPlacement(r.Context(), p, pl)
	}
	s.audit(r, "placement.set", p, iam.Display(p), err, fmt.Sprintf("pin=%v avoid=%v", pl.Pin, pl.Avoid))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, out)
}

// quotaDetail renders limits for the audit log.
func quotaDetail(q model.Quota) string {
	var parts []string
	add := func(name string, v *int64) {
		if v != nil {
			parts = append(parts, name+"="+strconv.FormatInt(*v, 10))
		}
	}
	add("sandboxes", q.Sandboxes)
	if q.CPUs != nil {
		parts = append(parts, "cpus="+strconv.FormatFloat(*q.CPUs, 'g', -1, 64))
	}
	add("memory_bytes", q.MemoryBytes)
	add("disk_bytes", q.DiskBytes)
	add("creates_per_minute", q.CreatesPerMinute)
	for t, n := range q.Tiers {
		parts = append(parts, "tiers."+t+"="+strconv.FormatInt(n, 10))
	}
	return strings.Join(parts, " ")
}

func (s *Server) createPrincipal(w http.ResponseWriter, r *http.Request) {
	var req model.Principal
	if err := httpjson.Decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	c := who(r)
	if req.Kind == "" {
		req.Kind = model.KindUser
	}
	p, err := c.project("project", req.Project)
	if err == nil {
		err = iam.CheckPrincipalName("name", req.Name)
	}
	if err == nil {
		err = iam.CheckKind(req.Kind)
	}
	if err == nil && (!req.CreatedAt.IsZero() || req.CreatedBy != "") {
		err = errdefs.Invalid("created_at", "created_at and created_by are set by the server")
	}
	if err == nil {
		err = c.require(iam.ProjectGrant, p)
	}
	if err == nil {
		err = s.store.CreatePrincipal(r.Context(), req, p, c.tok.Principal)
	}
	s.audit(r, "principal.create", p, req.Name, err, req.Kind)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	got, err := s.store.GetPrincipal(r.Context(), req.Name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	got.Project = iam.Display(got.Project)
	httpjson.Write(w, http.StatusCreated, got)
}

// checkGrant validates a grant and checks the caller may give (or take) it: project.grant on the
// project and every permission of the role there.
func (c *caller) checkGrant(g model.Grant, needRole bool) (string, error) {
	p, err := c.project("project", g.Project)
	if err != nil {
		return "", err
	}
	if err := iam.CheckPrincipalName("principal", g.Principal); err != nil {
		return p, err
	}
	perm := iam.ProjectGrant
	if g.Role != "" || needRole {
		rp, ok := iam.RolePerms(g.Role)
		if !ok {
			return p, errdefs.Invalid("role", "%q is not a role (%s)", g.Role, strings.Join(iam.Roles, ", "))
		}
		perm |= rp
	}
	return p, c.require(perm, p)
}

func (s *Server) grant(w http.ResponseWriter, r *http.Request) {
	var g model.Grant
	if err := httpjson.Decode(r, &g); err != nil {
		s.fail(w, r, err)
		return
	}
	c := who(r)
	p, err := c.checkGrant(g, true)
	if err == nil && (!g.CreatedAt.IsZero() || g.CreatedBy != "") {
		err = errdefs.Invalid("created_at", "created_at and created_by are set by the server")
	}
	if err == nil {
		err = s.store.AddGrant(r.Context(), p, g.Principal, g.Role, c.tok.Principal)
	}
	s.audit(r, "grant.add", p, g.Principal, err, g.Role)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	g.Project, g.CreatedAt, g.CreatedBy = iam.Display(p), time.Now().UTC(), c.tok.Principal
	httpjson.Write(w, http.StatusCreated, g)
}

func (s *Server) revokeGrant(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	g := model.Grant{Project: q.Get("project"), Principal: q.Get("principal"), Role: q.Get("role")}
	c := who(r)
	p, err := c.checkGrant(g, false)
	if err == nil {
		err = s.store.RemoveGrant(r.Context(), p, g.Principal, g.Role)
	}
	s.audit(r, "grant.revoke", p, g.Principal, err, g.Role)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// mintToken issues a token within the caller's reach: its project inside the caller's scope,
// its permissions among those the caller holds there, its life no longer than the caller's
// token's. Minting for another principal, or for a new one, needs project.grant.
func (s *Server) mintToken(w http.ResponseWriter, r *http.Request) {
	var req model.TokenRequest
	if err := httpjson.Decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	c := who(r)
	out, p, err := s.mint(r, c, req)
	target := ""
	if out != nil {
		target = out.ID
	}
	s.audit(r, "token.mint", p, target, err, strings.TrimSpace(req.Role+" "+strings.Join(req.Permissions, ",")))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusCreated, out)
}

func (s *Server) mint(r *http.Request, c *caller, req model.TokenRequest) (*model.Token, string, error) {
	if req.Project == "" {
		return nil, "", errdefs.Invalid("project", "a token needs a project (its scope)")
	}
	p, err := iam.ParsePath("project", req.Project)
	if err != nil {
		return nil, "", err
	}
	var perms iam.Perm
	switch {
	case req.Role != "" && len(req.Permissions) > 0:
		return nil, p, errdefs.Invalid("permissions", "give a role or a list of permissions, not both")
	case req.Role != "":
		var ok bool
		if perms, ok = iam.RolePerms(req.Role); !ok {
			return nil, p, errdefs.Invalid("role", "%q is not a role (%s)", req.Role, strings.Join(iam.Roles, ", "))
		}
	case len(req.Permissions) > 0:
		if perms, err = iam.ParsePerms(req.Permissions); err != nil {
			return nil, p, err
		}
	default:
		return nil, p, errdefs.Invalid("role", "a token needs a role or a list of permissions")
	}
	if err := c.require(perms, p); err != nil {
		return nil, p, err
	}
	var expires time.Time
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d < time.Second || d > maxTokenTTL {
			return nil, p, errdefs.Invalid("ttl", "%q must be a duration from 1s to %s", req.TTL, maxTokenTTL)
		}
		expires = time.Now().Add(d).UTC()
	}
	// A token never outlives the one that minted it.
	if pe := c.tok.ExpiresAt; !pe.IsZero() && (expires.IsZero() || expires.After(pe)) {
		expires = pe
	}
	secret, id := iam.NewToken()
	m := store.MintRequest{
		Token: store.TokenRecord{ID: id, Hash: HashToken(secret), Principal: c.tok.Principal, Perms: perms,
			Role: iam.RoleOf(perms), Parent: c.tok.ID, ExpiresAt: expires},
		CreatedBy: c.tok.Principal,
	}
	switch {
	case req.Kind != "" || req.Name != "":
		if req.Principal != "" {
			return nil, p, errdefs.Invalid("principal", "name an existing principal, or give kind and name for a new one, not both")
		}
		if req.Role == "" {
			return nil, p, errdefs.Invalid("role", "a new principal is granted a role, not a list of permissions")
		}
		if req.Kind == "" {
			req.Kind = model.KindAgent
		}
		if err := iam.CheckKind(req.Kind); err != nil {
			return nil, p, err
		}
		if req.Name == "" {
			req.Name = iam.NewID(req.Kind + "-")
		}
		if err := iam.CheckPrincipalName("name", req.Name); err != nil {
			return nil, p, err
		}
		if err := c.require(iam.ProjectGrant|perms, p); err != nil {
			return nil, p, err
		}
		m.Token.Principal = req.Name
		m.NewPrincipalKind = req.Kind
		m.GrantRole = req.Role
	case req.Principal != "" && req.Principal != c.tok.Principal:
		// Only for a principal of the caller's own subtree, with project.grant where it lives: a
		// token for anyone else would act (and be audited) as them.
		other, err := s.store.GetPrincipal(r.Context(), req.Principal)
		if errors.Is(err, errdefs.ErrNotFound) || (err == nil && !iam.Within(other.Project, c.tok.ProjectPath)) {
			return nil, p, errdefs.Invalid("principal", "no principal %q in project %s or below", req.Principal, iam.Display(c.tok.ProjectPath))
		} else if err != nil {
			return nil, p, err
		}
		if err := c.require(iam.ProjectGrant, other.Project); err != nil {
			return nil, p, err
		}
		if err := c.require(iam.ProjectGrant, p); err != nil {
			return nil, p, err
		}
		m.Token.Principal = req.Principal
	}
	proj, err := s.store.GetProject(r.Context(), p)
	if err != nil {
		return nil, p, err
	}
	m.Token.ProjectID, m.Token.ProjectPath = proj.ID, p
	m.MaxActive = maxActiveTokens
	if err := s.store.MintToken(r.Context(), m); err != nil {
		return nil, p, err
	}
	m.Token.CreatedAt = time.Now().UTC()
	v := m.Token.View()
	v.Token = secret
	return &v, p, nil
}

// manages reports whether the caller may see and revoke token t: it lies in the caller's scope
// and is the caller's principal's, minted from the caller's token, or in a project where the
// caller holds project.grant.
func (c *caller) manages(t *store.TokenRecord, minted map[string]bool) bool {
	if !iam.Within(t.ProjectPath, c.tok.ProjectPath) {
		return false
	}
	return t.Principal == c.tok.Principal || minted[t.ID] || c.perms(t.ProjectPath).Has(iam.ProjectGrant)
}

// tokensFor lists the tokens the caller manages.
func (s *Server) tokensFor(r *http.Request, c *caller) ([]*store.TokenRecord, error) {
	f := store.TokenFilter{Principal: c.tok.Principal, Projects: []string{c.tok.ProjectPath}}
	all, err := s.store.ListTokens(r.Context(), f)
	if err != nil {
		return nil, err
	}
	minted, err := s.store.ListTokens(r.Context(), store.TokenFilter{Ancestor: c.tok.ID})
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	for _, t := range minted {
		set[t.ID] = true
	}
	var out []*store.TokenRecord
	for _, t := range all {
		if c.manages(t, set) {
			out = append(out, t)
		}
	}
	return out, nil
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) {
	list, err := s.tokensFor(r, who(r))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]model.Token, 0, len(list))
	for _, t := range list {
		out = append(out, t.View())
	}
	httpjson.Write(w, http.StatusOK, out)
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request) {
	c := who(r)
	id := r.PathValue("id")
	list, err := s.tokensFor(r, c)
	project := c.tok.ProjectPath
	if err == nil {
		err = errdefs.NotFound("token %s (or not one this token may manage)", id)
		for _, t := range list {
			if t.ID == id {
				project, err = t.ProjectPath, nil
			}
		}
	}
	var t *store.TokenRecord
	if err == nil {
		t, err = s.store.RevokeToken(r.Context(), id)
	}
	s.audit(r, "token.revoke", project, id, err, "")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, t.View())
}

func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	p, _ := who(r).project("project", q.Get("project"))
	aq := model.AuditQuery{Action: q.Get("action")}
	var err error
	if v := q.Get("before"); v != "" {
		if aq.Before, err = strconv.ParseInt(v, 10, 64); err != nil || aq.Before < 0 {
			s.fail(w, r, errdefs.Invalid("before", "%q is not an entry ID", v))
			return
		}
	}
	if v := q.Get("limit"); v != "" {
		if aq.Limit, err = strconv.Atoi(v); err != nil || aq.Limit < 1 || aq.Limit > 1000 {
			s.fail(w, r, errdefs.Invalid("limit", "%q must be 1-1000", v))
			return
		}
	}
	list, err := s.store.ListAudit(r.Context(), p, aq)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, list)
}
