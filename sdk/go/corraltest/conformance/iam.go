package conformance

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"

	corral "github.com/corral-dev/corral/sdk/go"
)

func unauthorized(s *suite) {
	for _, token := range []string{"", "not-a-token"} {
		c := corral.New(s.URL, token)
		_, err := c.ListSandboxes(s.ctx, corral.ListOptions{})
		s.wantError("list sandboxes with token "+token, err, http.StatusUnauthorized, corral.CodeUnauthorized, "")
		_, err = c.CreateSandbox(s.ctx, corral.CreateRequest{Base: s.Base})
		s.wantError("create with token "+token, err, http.StatusUnauthorized, corral.CodeUnauthorized, "")
	}
}

// project creates the case's own project, conformance-UNIQ (a path as the server shows it: no
// leading slash), deleted with its sandboxes when the case ends.
func (s *suite) project() string {
	s.t.Helper()
	path := "conformance-" + s.uniq
	p, err := s.Client.CreateProject(s.ctx, path)
	if err != nil {
		s.t.Fatalf("create project: %v", err)
	}
	if p.Path != path {
		s.t.Errorf("created project path = %q, want %q", p.Path, path)
	}
	s.t.Cleanup(func() { s.Client.DeleteProject(context.Background(), path, true) })
	return path
}

func projects(s *suite) {
	path := s.project()
	_, err := s.Client.CreateProject(s.ctx, path)
	s.wantError("create a project that exists", err, http.StatusConflict, corral.CodeConflict, "")
	_, err = s.Client.CreateProject(s.ctx, path+"-none/child")
	s.wantError("create a project under a missing parent", err, http.StatusNotFound, corral.CodeNotFound, "")
	_, err = s.Client.CreateProject(s.ctx, "/Not A Name")
	s.wantError("create a project with a bad name", err, http.StatusBadRequest, corral.CodeInvalid, "path")
	child, err := s.Client.CreateProject(s.ctx, path+"/child")
	if err != nil {
		s.t.Fatalf("create a child project: %v", err)
	}
	if child.Parent != path {
		s.t.Errorf("child's parent = %q, want %q", child.Parent, path)
	}
	got, err := s.Client.Project(s.ctx, path)
	if err != nil {
		s.t.Fatalf("get project: %v", err)
	}
	if got.Path != path || got.Sandboxes != 0 {
		s.t.Errorf("project = %+v, want %s without sandboxes", got, path)
	}
	under, err := s.Client.Projects(s.ctx, path)
	if err != nil {
		s.t.Fatalf("list projects: %v", err)
	}
	var paths []string
	for _, p := range under {
		paths = append(paths, p.Path)
	}
	if !slices.Equal(paths, []string{path, path + "/child"}) {
		s.t.Errorf("projects under %s = %v, want it and its child, parent first", path, paths)
	}
	_, err = s.Client.Project(s.ctx, path+"-none")
	s.wantError("get a missing project", err, http.StatusNotFound, corral.CodeNotFound, "")

	sb := s.create(corral.CreateRequest{Project: path})
	if sb.Project != path {
		s.t.Errorf("sandbox project = %q, want %q", sb.Project, path)
	}
	in, err := s.Client.ListSandboxes(s.ctx, corral.ListOptions{Project: path})
	if err != nil {
		s.t.Fatalf("list sandboxes of the project: %v", err)
	}
	if !slices.Equal(ids(in), []string{sb.ID}) {
		s.t.Errorf("sandboxes of %s = %v, want [%s]", path, ids(in), sb.ID)
	}
	err = s.Client.DeleteProject(s.ctx, path, false)
	s.wantError("delete a project with a live sandbox", err, http.StatusConflict, corral.CodeConflict, "")
	if err := s.Client.DeleteProject(s.ctx, path, true); err != nil {
		s.t.Fatalf("delete a project with force: %v", err)
	}
	_, err = s.Client.Project(s.ctx, path+"/child")
	s.wantError("get a deleted project's child", err, http.StatusNotFound, corral.CodeNotFound, "")
}

func tokens(s *suite) {
	path := s.project()
	tok, err := s.Client.CreateToken(s.ctx, corral.TokenRequest{Project: path, Role: corral.RoleViewer, Kind: "agent", Name: "viewer-" + s.uniq})
	if err != nil {
		s.t.Fatalf("mint a viewer token: %v", err)
	}
	if tok.Token == "" || tok.ID == "" || tok.Project != path || tok.Principal == "" {
		s.t.Errorf("minted token = %+v, want a secret, an id, project %s and a principal", tok, path)
	}
	viewer := corral.New(s.URL, tok.Token)
	who, err := viewer.Whoami(s.ctx)
	if err != nil {
		s.t.Fatalf("whoami: %v", err)
	}
	if who.Token.ID != tok.ID || who.Principal.Name != tok.Principal || !slices.Contains(who.Permissions, corral.PermSandboxRead) ||
		slices.Contains(who.Permissions, corral.PermSandboxCreate) {
		s.t.Errorf("whoami = %+v, want token %s of %s, reading but not creating sandboxes", who, tok.ID, tok.Principal)
	}
	if _, err := viewer.ListSandboxes(s.ctx, corral.ListOptions{}); err != nil {
		s.t.Errorf("a viewer lists sandboxes: %v", err)
	}
	_, err = viewer.CreateSandbox(s.ctx, corral.CreateRequest{Base: s.Base})
	s.wantError("a viewer creates a sandbox", err, http.StatusForbidden, corral.CodeDenied, "")
	if e, ok := errors.AsType[*corral.APIError](err); ok && e.Permission != corral.PermSandboxCreate {
		s.t.Errorf("a viewer's refused create names permission %q, want %q", e.Permission, corral.PermSandboxCreate)
	}
	_, err = viewer.CreateToken(s.ctx, corral.TokenRequest{Project: path, Role: corral.RoleAdmin})
	s.wantError("a viewer mints an admin token", err, http.StatusForbidden, corral.CodeDenied, "")
	_, err = s.Client.CreateToken(s.ctx, corral.TokenRequest{Project: path, Role: "emperor"})
	s.wantError("mint a token of an unknown role", err, http.StatusBadRequest, corral.CodeInvalid, "role")

	if _, err := s.Client.RevokeToken(s.ctx, tok.ID); err != nil {
		s.t.Fatalf("revoke token: %v", err)
	}
	_, err = viewer.ListSandboxes(s.ctx, corral.ListOptions{})
	s.wantError("a revoked token lists sandboxes", err, http.StatusUnauthorized, corral.CodeUnauthorized, "")
	_, err = s.Client.RevokeToken(s.ctx, "tok-conformance-missing")
	s.wantError("revoke a missing token", err, http.StatusNotFound, corral.CodeNotFound, "")
}

func quota(s *suite) {
	path := s.project()
	one := int64(1)
	q, err := s.Client.SetQuota(s.ctx, path, corral.Quota{Sandboxes: &one})
	if err != nil {
		s.t.Fatalf("set quota: %v", err)
	}
	if q.Limit.Sandboxes == nil || *q.Limit.Sandboxes != 1 {
		s.t.Errorf("quota limit = %+v, want sandboxes 1", q.Limit)
	}
	s.create(corral.CreateRequest{Project: path})
	_, err = s.Client.CreateSandbox(s.ctx, corral.CreateRequest{Base: s.Base, Project: path})
	s.wantError("create beyond the sandboxes quota", err, http.StatusTooManyRequests, corral.CodeExhausted, "")
	if e, ok := errors.AsType[*corral.APIError](err); ok && (e.Quota == nil || e.Quota.Resource != "sandboxes" || e.Quota.Project != path) {
		s.t.Errorf("refusal's quota = %+v, want resource sandboxes of %s", e.Quota, path)
	}
	got, err := s.Client.Quota(s.ctx, path)
	if err != nil {
		s.t.Fatalf("get quota: %v", err)
	}
	if got.Usage.Sandboxes != 1 {
		s.t.Errorf("quota usage = %+v, want 1 sandbox", got.Usage)
	}
	neg := int64(-1)
	_, err = s.Client.SetQuota(s.ctx, path, corral.Quota{Sandboxes: &neg})
	s.wantError("set a negative quota", err, http.StatusBadRequest, corral.CodeInvalid, "sandboxes")
	_, err = s.Client.SetQuota(s.ctx, path, corral.Quota{Tiers: map[string]int64{"mainframe": 1}})
	s.wantError("set a quota of an unknown tier", err, http.StatusBadRequest, corral.CodeInvalid, "tiers")
}

func auditPaging(s *suite) {
	path := s.project()
	for i := range 3 {
		if _, err := s.Client.CreateProject(s.ctx, path+"/p"+string(rune('a'+i))); err != nil {
			s.t.Fatalf("create project: %v", err)
		}
	}
	first, err := s.Client.Audit(s.ctx, corral.AuditQuery{Project: path, Action: "project.", Limit: 2})
	if err != nil {
		s.t.Fatalf("audit: %v", err)
	}
	if len(first) != 2 || first[0].ID <= first[1].ID {
		s.t.Fatalf("audit page of 2 = %+v, want 2 entries, newest first", first)
	}
	rest, err := s.Client.Audit(s.ctx, corral.AuditQuery{Project: path, Action: "project.", Before: first[1].ID})
	if err != nil {
		s.t.Fatalf("audit: %v", err)
	}
	if len(rest) == 0 || rest[0].ID >= first[1].ID {
		s.t.Errorf("audit page before %d = %+v, want older entries", first[1].ID, rest)
	}
	for _, e := range append(first, rest...) {
		if e.Result != "ok" || !strings.HasPrefix(e.Action, "project.") {
			s.t.Errorf("audit entry %+v: want an ok project action", e)
		}
	}
}

func info(s *suite) {
	if err := s.Client.Health(s.ctx); err != nil {
		s.t.Errorf("health: %v", err)
	}
	if err := corral.New(s.URL, "").Health(s.ctx); err != nil {
		s.t.Errorf("health without a token: %v (want it open)", err)
	}
	in, err := s.Client.Info(s.ctx)
	if err != nil {
		s.t.Fatalf("info: %v", err)
	}
	if in.Version == "" || in.Node == "" || in.Runtime == "" {
		s.t.Errorf("info = %+v, want a version, a node and a runtime", in)
	}
	_, err = s.Client.ListSandboxes(s.ctx, corral.ListOptions{Labels: map[string]string{"": "x"}})
	s.wantError("list with an empty label key", err, http.StatusBadRequest, corral.CodeInvalid, "label")
	status, e := s.raw(http.MethodGet, "/v1/conformance-no-such-route", s.Token, nil)
	if status != http.StatusNotFound || e.Code != corral.CodeNotFound || e.Message == "" {
		s.t.Errorf("an unknown route: %d %+v, want a JSON 404 not_found", status, e)
	}
	_, err = s.Client.ListSandboxes(s.ctx, corral.ListOptions{State: "sideways"})
	s.wantError("list with an unknown state", err, http.StatusBadRequest, corral.CodeInvalid, "state")
}
