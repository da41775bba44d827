package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// iamServer is the API's identity routes over a real store, without an edge: everything but
// sandboxes.
type iamServer struct {
	t     testing.TB
	srv   *Server
	url   string
	root  string // the admin token
	store *store.Store
}

func newIAMServer(t *testing.T) *iamServer {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	root, _ := iam.NewToken()
	if err := st.AddRootToken(context.Background(), HashToken(root)); err != nil {
		t.Fatal(err)
	}
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil)), store: st, auditor: st}
	mux := http.NewServeMux()
	s.iamRoutes(mux)
	hs := httptest.NewServer(s.authenticate(mux))
	t.Cleanup(hs.Close)
	return &iamServer{t: t, srv: s, url: hs.URL, root: root, store: st}
}

// call sends a JSON request with token and returns the status and decoded error body.
func (h *iamServer) call(token, method, path string, body, out any) (int, model.Error) {
	h.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, h.url+path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var e model.Error
	if resp.StatusCode >= 400 {
		json.Unmarshal(raw, &e)
	} else if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			h.t.Fatalf("%s %s: decode %q: %v", method, path, raw, err)
		}
	}
	return resp.StatusCode, e
}

// must is call that fails the test unless the status is want.
func (h *iamServer) must(want int, token, method, path string, body, out any) model.Error {
	h.t.Helper()
	got, e := h.call(token, method, path, body, out)
	if got != want {
		h.t.Fatalf("%s %s: status %d (%s: %s), want %d", method, path, got, e.Code, e.Message, want)
	}
	return e
}

// mint creates a token through the API.
func (h *iamServer) mint(by string, req model.TokenRequest) model.Token {
	h.t.Helper()
	var tok model.Token
	h.must(http.StatusCreated, by, "POST", "/v1/tokens", req, &tok)
	if tok.Token == "" || tok.ID == "" {
		h.t.Fatalf("minted %+v", tok)
	}
	return tok
}

// TestAuthorisationMatrix checks principal × permission × position in the tree against the
// model: a request may do X on P when P is in the token's scope, the token carries X, and a
// grant on P or an ancestor gives the principal X.
func TestAuthorisationMatrix(t *testing.T) {
	h := newIAMServer(t)
	for _, p := range []string{"a", "a/b", "a/b/c", "a-b", "d"} {
		h.must(http.StatusCreated, h.root, "POST", "/v1/projects", model.ProjectRequest{Path: p}, nil)
	}
	for _, g := range []model.Grant{
		{Project: "a", Principal: "alice", Role: "admin"},
		{Project: "a", Principal: "bob", Role: "viewer"},
		{Project: "a/b", Principal: "bob", Role: "user"},
		{Project: "d", Principal: "carol", Role: "owner"},
	} {
		h.call(h.root, "POST", "/v1/principals", model.Principal{Name: g.Principal, Project: "/"}, nil)
		h.must(http.StatusCreated, h.root, "POST", "/v1/grants", g, nil)
	}
	tokens := map[string]string{"root": h.root}
	for name, req := range map[string]model.TokenRequest{
		"alice":      {Project: "a", Role: "admin", Principal: "alice"},
		"alice-ab":   {Project: "a/b", Role: "user", Principal: "alice"},
		"bob":        {Project: "a", Role: "user", Principal: "bob"}, // more than bob holds on a: his grants still bound it
		"carol":      {Project: "d", Role: "owner", Principal: "carol"},
		"alice-read": {Project: "a", Permissions: []string{model.PermSandboxRead}, Principal: "alice"},
	} {
		tokens[name] = h.mint(h.root, req).Token
	}
	ctx := context.Background()
	for _, c := range []struct {
		token   string
		perm    iam.Perm
		project string
		want    bool
	}{
		{"root", iam.Operator, "", true},
		{"root", iam.SandboxAdmin, "a/b/c", true},
		{"alice", iam.SandboxAdmin, "a", true},
		{"alice", iam.SandboxAdmin, "a/b/c", true}, // held on an ancestor
		{"alice", iam.ProjectGrant, "a", false},    // admin does not grant
		{"alice", iam.Operator, "a", false},
		{"alice", iam.SandboxRead, "", false},    // above the scope
		{"alice", iam.SandboxRead, "a-b", false}, // beside it, sharing a prefix
		{"alice", iam.SandboxRead, "d", false},
		{"alice-ab", iam.SandboxCreate, "a/b/c", true},
		{"alice-ab", iam.SandboxAdmin, "a/b", false}, // the token carries only user
		{"alice-ab", iam.SandboxCreate, "a", false},  // above this token's scope
		{"alice-read", iam.SandboxRead, "a/b", true},
		{"alice-read", iam.LayerRead, "a/b", false},
		{"bob", iam.SandboxRead, "a", true},
		{"bob", iam.SandboxCreate, "a", false},    // viewer there; the token's user does not add
		{"bob", iam.SandboxCreate, "a/b", true},   // user on a/b
		{"bob", iam.SandboxCreate, "a/b/c", true}, // ...and below
		{"bob", iam.SandboxAdmin, "a/b", false},
		{"carol", iam.ProjectGrant, "d", true},
		{"carol", iam.Operator, "d", true}, // held, but only ever checked on the root
		{"carol", iam.SandboxRead, "a", false},
	} {
		cl, err := h.srv.caller(ctx, "Bearer "+tokens[c.token])
		if err != nil {
			t.Fatal(err)
		}
		err = cl.require(c.perm, c.project)
		if got := err == nil; got != c.want {
			t.Errorf("%s %v on %s: allowed %v, want %v (%v)", c.token, c.perm, iam.Display(c.project), got, c.want, err)
		}
		if err != nil && !strings.Contains(err.Error(), c.perm.String()) {
			t.Errorf("the refusal does not name %v: %v", c.perm, err)
		}
	}
	// The same decisions through HTTP, on routes that need each permission.
	for _, c := range []struct {
		token, method, path string
		body                any
		want                int
		perm                string
	}{
		{"alice", "POST", "/v1/projects", model.ProjectRequest{Path: "a/new"}, 201, ""},
		{"alice", "POST", "/v1/projects", model.ProjectRequest{Path: "top"}, 403, model.PermProjectCreate},
		{"alice-ab", "POST", "/v1/projects", model.ProjectRequest{Path: "a/b/n"}, 403, model.PermProjectCreate},
		{"alice", "PUT", "/v1/quotas/a/b", model.Quota{Sandboxes: ptr[int64](3)}, 200, ""},
		{"alice", "PUT", "/v1/quotas/a", model.Quota{Sandboxes: ptr[int64](3)}, 403, model.PermQuotaDelegate}, // its own
		{"bob", "GET", "/v1/quotas/a/b", nil, 200, ""},
		{"bob", "GET", "/v1/quotas/d", nil, 403, model.PermProjectRead},
		{"alice", "POST", "/v1/grants", model.Grant{Project: "a/b", Principal: "bob", Role: "user"}, 403, model.PermProjectGrant},
		{"carol", "POST", "/v1/grants", model.Grant{Project: "a", Principal: "bob", Role: "viewer"}, 403, model.PermProjectGrant},
		{"carol", "POST", "/v1/grants", model.Grant{Project: "d", Principal: "bob", Role: "viewer"}, 201, ""},
		{"carol", "POST", "/v1/grants", model.Grant{Project: "d", Principal: "bob", Role: "root"}, 400, ""},
		{"alice", "GET", "/v1/audit?project=a", nil, 200, ""},
		{"bob", "GET", "/v1/audit?project=a", nil, 403, model.PermAuditRead},
		{"alice", "POST", "/v1/projects/move", model.MoveProjectRequest{From: "a/new", To: "d/new"}, 403, model.PermProjectCreate},
		{"nobody", "GET", "/v1/whoami", nil, 401, ""},
	} {
		tok := tokens[c.token]
		if c.token == "nobody" {
			tok = "crl_not-a-token"
		}
		got, e := h.call(tok, c.method, c.path, c.body, nil)
		if got != c.want || !strings.Contains(e.Permission, c.perm) || (c.perm == "") != (e.Permission == "") {
			t.Errorf("%s %s %s: %d (permission %q, %s), want %d (%q)", c.token, c.method, c.path, got, e.Permission, e.Message, c.want, c.perm)
		}
	}
}

// TestAgentRollout is the harness story at the API: a harness with a project token makes
// a subproject for one rollout, delegates it quota, mints an agent token there and hands it
// over; the agent acts only there.
func TestAgentRollout(t *testing.T) {
	h := newIAMServer(t)
	h.must(201, h.root, "POST", "/v1/projects", model.ProjectRequest{Path: "team-a"}, nil)
	h.must(200, h.root, "PUT", "/v1/quotas/team-a", model.Quota{Sandboxes: ptr[int64](20)}, nil)
	harness := h.mint(h.root, model.TokenRequest{Project: "team-a", Role: "owner", Kind: model.KindService, Name: "harness"})
	if harness.Principal != "harness" || harness.Project != "team-a" || harness.Role != "owner" {
		t.Fatalf("harness token %+v", harness)
	}
	hk := harness.Token
	h.must(201, hk, "POST", "/v1/projects", model.ProjectRequest{Path: "team-a/rollout-17"}, nil)
	h.must(201, hk, "POST", "/v1/projects", model.ProjectRequest{Path: "team-a/rollout-18"}, nil)
	var q model.ProjectQuota
	h.must(200, hk, "PUT", "/v1/quotas/team-a/rollout-17", model.Quota{Sandboxes: ptr[int64](10)}, &q)
	if *q.Limit.Sandboxes != 10 {
		t.Fatalf("quota %+v", q)
	}
	// The sum of delegations stays within the parent's 20.
	if code, e := h.call(hk, "PUT", "/v1/quotas/team-a/rollout-18", model.Quota{Sandboxes: ptr[int64](11)}, nil); code != 409 || !strings.Contains(e.Message, "at most 10 more") {
		t.Fatalf("over-delegation: %d %s", code, e.Message)
	}
	agent := h.mint(hk, model.TokenRequest{Project: "team-a/rollout-17", Role: "user", TTL: "1h"})
	// Without kind or name the token is the minter's own.
	if agent.Principal != "harness" {
		t.Fatalf("a token without kind/name is the minter's own: %+v", agent)
	}
	agentTok := h.mint(hk, model.TokenRequest{Project: "team-a/rollout-17", Role: "user", Kind: model.KindAgent, TTL: "1h"})
	if !strings.HasPrefix(agentTok.Principal, "agent-") || agentTok.ExpiresAt == nil || agentTok.Parent != harness.ID {
		t.Fatalf("agent token %+v", agentTok)
	}
	ak := agentTok.Token
	var me model.Whoami
	h.must(200, ak, "GET", "/v1/whoami", nil, &me)
	if me.Principal.Kind != model.KindAgent || me.Token.Project != "team-a/rollout-17" || strings.Contains(strings.Join(me.Permissions, ","), "admin") {
		t.Fatalf("whoami %+v", me)
	}
	// The agent sees its project and nothing above or beside it.
	var projects []model.Project
	h.must(200, ak, "GET", "/v1/projects", nil, &projects)
	if len(projects) != 1 || projects[0].Path != "team-a/rollout-17" {
		t.Fatalf("the agent lists %+v", projects)
	}
	h.must(403, ak, "GET", "/v1/projects/team-a", nil, nil)
	h.must(403, ak, "GET", "/v1/projects/team-a/rollout-18", nil, nil)
	h.must(403, ak, "GET", "/v1/quotas/team-a", nil, nil)
	// It cannot raise its own quota, make projects, grant, or mint beyond what it holds.
	if e := h.must(403, ak, "PUT", "/v1/quotas/team-a/rollout-17", model.Quota{Sandboxes: ptr[int64](1000)}, nil); e.Permission != model.PermQuotaDelegate {
		t.Errorf("own quota refusal names %q", e.Permission)
	}
	h.must(403, ak, "POST", "/v1/projects", model.ProjectRequest{Path: "team-a/rollout-17/sub"}, nil)
	h.must(403, ak, "POST", "/v1/grants", model.Grant{Project: "team-a/rollout-17", Principal: agentTok.Principal, Role: "admin"}, nil)
	if e := h.must(403, ak, "POST", "/v1/tokens", model.TokenRequest{Project: "team-a/rollout-17", Role: "admin"}, nil); !strings.Contains(e.Permission, model.PermSandboxAdmin) {
		t.Errorf("over-minting refusal names %q", e.Permission)
	}
	h.must(403, ak, "POST", "/v1/tokens", model.TokenRequest{Project: "team-a", Role: "viewer"}, nil)
	h.must(403, ak, "POST", "/v1/tokens", model.TokenRequest{Project: "team-a/rollout-17", Role: "viewer", Kind: model.KindAgent}, nil)
	// It can hand a narrower token of its own down; it cannot outlive the agent's.
	sub := h.mint(ak, model.TokenRequest{Project: "team-a/rollout-17", Role: "viewer", TTL: "24h"})
	if sub.ExpiresAt == nil || sub.ExpiresAt.After(*agentTok.ExpiresAt) {
		t.Errorf("a child token outlives its parent: %v > %v", sub.ExpiresAt, agentTok.ExpiresAt)
	}
	var toks []model.Token
	h.must(200, ak, "GET", "/v1/tokens", nil, &toks)
	if len(toks) != 2 {
		t.Errorf("the agent manages %d tokens, want its own and its child: %+v", len(toks), toks)
	}
	// Revoking the agent's token ends it and what it minted.
	h.must(200, hk, "DELETE", "/v1/tokens/"+agentTok.ID, nil, nil)
	h.must(401, ak, "GET", "/v1/whoami", nil, nil)
	h.must(401, sub.Token, "GET", "/v1/whoami", nil, nil)
	// The audit log has it all, with principals, readable by the harness for its project.
	var entries []model.AuditEntry
	h.must(200, hk, "GET", "/v1/audit?project=team-a", nil, &entries)
	var actions []string
	for _, e := range entries {
		actions = append(actions, e.Action+":"+e.Result)
	}
	got := strings.Join(actions, " ")
	for _, want := range []string{"token.revoke:ok", "quota.set:denied", "token.mint:ok", "project.create:ok", "quota.set:conflict"} {
		if !strings.Contains(got, want) {
			t.Errorf("audit lacks %s: %s", want, got)
		}
	}
	var roots []model.AuditEntry
	h.must(200, h.root, "GET", "/v1/audit?project=/&action=token.", nil, &roots)
	if len(roots) == 0 || roots[0].Principal == "" {
		t.Errorf("token audit entries: %+v", roots)
	}
}

func TestTokenExpiryAndRevocation(t *testing.T) {
	h := newIAMServer(t)
	short := h.mint(h.root, model.TokenRequest{Project: "/", Role: "viewer", TTL: "1s"})
	h.must(200, short.Token, "GET", "/v1/whoami", nil, nil)
	time.Sleep(1100 * time.Millisecond)
	if _, e := h.call(short.Token, "GET", "/v1/whoami", nil, nil); !strings.Contains(e.Message, "expired") {
		t.Errorf("expired token: %+v", e)
	}
	h.must(400, h.root, "POST", "/v1/tokens", model.TokenRequest{Project: "/", Role: "viewer", TTL: "forever"}, nil)
	h.must(400, h.root, "POST", "/v1/tokens", model.TokenRequest{Project: "/"}, nil)
	h.must(400, h.root, "POST", "/v1/tokens", model.TokenRequest{Project: "/", Role: "user", Permissions: []string{"sandbox.read"}}, nil)
	h.must(401, "", "GET", "/v1/whoami", nil, nil)
	tok := h.mint(h.root, model.TokenRequest{Project: "/", Role: "viewer"})
	h.must(200, h.root, "DELETE", "/v1/tokens/"+tok.ID, nil, nil)
	if _, e := h.call(tok.Token, "GET", "/v1/whoami", nil, nil); !strings.Contains(e.Message, "revoked") {
		t.Errorf("revoked token: %+v", e)
	}
	// Only the hash is stored.
	if rec, err := h.store.TokenByHash(context.Background(), HashToken(tok.Token)); err != nil || rec.Hash == tok.Token {
		t.Errorf("token record %+v, %v", rec, err)
	}
}

// FuzzMintRequest throws arbitrary bodies at POST /v1/tokens with a viewer token: the server must
// answer without a 5xx, and whatever it mints must carry no more than viewer on its scope.
func FuzzMintRequest(f *testing.F) {
	for _, s := range []string{
		`{"project":"/","role":"viewer"}`, `{"project":"a","role":"owner"}`, `{"project":"/","permissions":["operator"]}`,
		`{"project":"/","role":"viewer","kind":"agent","name":"x"}`, `{"project":"../..","role":"viewer"}`, `{"project":"/","role":"viewer","ttl":"-1s"}`,
		`{"project":"/","role":"viewer","principal":"root"}`, `[]`, `{"project":"/","role":"viewer","extra":1}`,
	} {
		f.Add(s)
	}
	url, viewerToken := fuzzServer(f)
	f.Fuzz(func(t *testing.T, body string) {
		req, _ := http.NewRequest("POST", url+"/v1/tokens", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+viewerToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			t.Fatalf("%q: %d %s", body, resp.StatusCode, raw)
		}
		if resp.StatusCode != http.StatusCreated {
			return
		}
		var tok model.Token
		if err := json.Unmarshal(raw, &tok); err != nil {
			t.Fatal(err)
		}
		perms, err := iam.ParsePerms(tok.Permissions)
		viewer, _ := iam.RolePerms(model.RoleViewer)
		if err != nil || !viewer.Has(perms) || tok.Principal != "viewer" {
			t.Fatalf("%q minted %+v", body, tok)
		}
	})
}

// fuzzServer is one server for a whole fuzz run: a viewer principal on the root, and a project.
func fuzzServer(f *testing.F) (url, viewer string) {
	st, err := store.Open(context.Background(), filepath.Join(f.TempDir(), "corral.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil)), store: st, auditor: st}
	mux := http.NewServeMux()
	s.iamRoutes(mux)
	hs := httptest.NewServer(s.authenticate(mux))
	f.Cleanup(hs.Close)
	root, _ := iam.NewToken()
	if err := st.AddRootToken(context.Background(), HashToken(root)); err != nil {
		f.Fatal(err)
	}
	h := &iamServer{t: f, url: hs.URL, root: root, store: st}
	h.must(http.StatusCreated, root, "POST", "/v1/projects", model.ProjectRequest{Path: "a"}, nil)
	v := h.mint(root, model.TokenRequest{Project: "/", Role: "viewer", Kind: model.KindUser, Name: "viewer"})
	return hs.URL, v.Token
}

func ptr[T any](v T) *T { return &v }

// TestMovesCannotEscapeScope checks that moving projects never widens what a token reaches: a
// scoped token cannot move its project (or anything) out of its subtree, and a token whose project
// an operator moves follows the project, seeing nothing of its new surroundings.
func TestMovesCannotEscapeScope(t *testing.T) {
	h := newIAMServer(t)
	for _, p := range []string{"team-a", "team-a/r", "team-a/r/sub", "team-b", "team-b/secret"} {
		h.must(201, h.root, "POST", "/v1/projects", model.ProjectRequest{Path: p}, nil)
	}
	harness := h.mint(h.root, model.TokenRequest{Project: "team-a", Role: "owner", Kind: model.KindService, Name: "harness"}).Token
	agent := h.mint(harness, model.TokenRequest{Project: "team-a/r", Role: "admin", Kind: model.KindAgent, Name: "bot"}).Token
	// Out of the harness's subtree, or into someone else's: refused on the side it lacks.
	for _, m := range []model.MoveProjectRequest{
		{From: "team-a/r", To: "r"}, {From: "team-a/r", To: "team-b/r"}, {From: "team-b/secret", To: "team-a/secret"}, {From: "team-a", To: "team-c"},
	} {
		if e := h.must(403, harness, "POST", "/v1/projects/move", m, nil); e.Permission != model.PermProjectCreate {
			t.Errorf("move %+v: permission %q", m, e.Permission)
		}
	}
	// The agent cannot lift its subproject up to its own level or move its own project.
	h.must(403, agent, "POST", "/v1/projects/move", model.MoveProjectRequest{From: "team-a/r/sub", To: "team-a/sub"}, nil)
	h.must(403, agent, "POST", "/v1/projects/move", model.MoveProjectRequest{From: "team-a/r", To: "team-a/r2"}, nil)
	// Within the harness's subtree a move is fine.
	var moved model.Project
	h.must(200, harness, "POST", "/v1/projects/move", model.MoveProjectRequest{From: "team-a/r/sub", To: "team-a/sub"}, &moved)
	if moved.Path != "team-a/sub" || moved.Parent != "team-a" {
		t.Errorf("moved %+v", moved)
	}
	// The operator moves the agent's project under team-b: the agent's token follows it and
	// still reaches only that project, not team-b or its other children.
	h.must(200, h.root, "POST", "/v1/projects/move", model.MoveProjectRequest{From: "team-a/r", To: "team-b/r"}, nil)
	var me model.Whoami
	h.must(200, agent, "GET", "/v1/whoami", nil, &me)
	if me.Token.Project != "team-b/r" {
		t.Errorf("the agent's scope after the move: %q", me.Token.Project)
	}
	h.must(403, agent, "GET", "/v1/projects/team-b/secret", nil, nil)
	h.must(403, agent, "GET", "/v1/projects/team-b", nil, nil)
	var ps []model.Project
	h.must(200, agent, "GET", "/v1/projects?under=/", nil, &ps)
	if len(ps) != 1 || ps[0].Path != "team-b/r" {
		t.Errorf("the agent lists %+v", ps)
	}
	// The harness lost the project with the move: it is no longer in team-a's subtree.
	h.must(403, harness, "GET", "/v1/projects/team-b/r", nil, nil)
	// The agent's grant came with it (admin on its project), so it can still work there.
	h.must(201, agent, "POST", "/v1/projects", model.ProjectRequest{Path: "team-b/r/new"}, nil)
}

// TestNoWiderReach covers ways a project owner could reach past its subtree: minting tokens for
// principals elsewhere, learning where objects outside its scope live, reading a deleted
// project's history through a project that takes its path, and polluting another tenant's audit
// log with refusals.
func TestNoWiderReach(t *testing.T) {
	h := newIAMServer(t)
	for _, p := range []string{"team-a", "team-a/r17", "team-b"} {
		h.must(201, h.root, "POST", "/v1/projects", model.ProjectRequest{Path: p}, nil)
	}
	owner := h.mint(h.root, model.TokenRequest{Project: "team-a/r17", Role: "owner", Kind: model.KindUser, Name: "owner17"})
	h.must(201, h.root, "POST", "/v1/principals", model.Principal{Name: "bob", Project: "team-b"}, nil)
	// Minting as someone outside the subtree (root, a principal of team-b) is refused.
	for _, who := range []string{"root", "bob", "nobody"} {
		if code, e := h.call(owner.Token, "POST", "/v1/tokens", model.TokenRequest{Project: "team-a/r17", Role: "viewer", Principal: who}, nil); code != 400 {
			t.Errorf("minted as %s: %d %s", who, code, e.Message)
		}
	}
	// ...but fine for a principal created inside it.
	h.must(201, owner.Token, "POST", "/v1/principals", model.Principal{Name: "helper", Project: "team-a/r17"}, nil)
	if tok := h.mint(owner.Token, model.TokenRequest{Project: "team-a/r17", Role: "viewer", Principal: "helper"}); tok.Principal != "helper" {
		t.Errorf("minted %+v", tok)
	}
	// A refusal outside the scope does not name where the target lives.
	_, e := h.call(owner.Token, "GET", "/v1/quotas/team-b", nil, nil)
	if e.Permission != model.PermProjectRead || strings.Contains(e.Message, "team-b") {
		t.Errorf("refusal outside the scope: %+v", e)
	}
	// A project that does not exist answers 404, not a dropped connection.
	h.must(404, owner.Token, "GET", "/v1/projects/team-a/r17/nope", nil, nil)
	// Refusals naming another tenant's (missing) project stay in the refused caller's log, and
	// control characters never reach a reader's terminal.
	h.must(403, owner.Token, "POST", "/v1/projects", model.ProjectRequest{Path: "team-b/ghost"}, nil)
	h.call(owner.Token, "POST", "/v1/tokens", model.TokenRequest{Project: "team-a/r17", Role: "\x1b[2Jfake"}, nil)
	var b, a []model.AuditEntry
	h.must(200, h.root, "GET", "/v1/audit?project=team-b", nil, &b)
	for _, e := range b {
		if e.Principal == "owner17" {
			t.Errorf("owner17's refusal is in team-b's log: %+v", e)
		}
	}
	h.must(200, h.root, "GET", "/v1/audit?project=team-a/r17", nil, &a)
	var ghost bool
	for _, e := range a {
		ghost = ghost || e.Project == "team-b/ghost"
		if strings.ContainsAny(e.Detail+e.Target, "\x1b") {
			t.Errorf("a control character in the log: %q", e.Detail)
		}
	}
	if !ghost {
		t.Errorf("the refusal is not in the caller's log: %+v", a)
	}
	// A deleted project's history goes to its parent, not to the next project at its path.
	h.must(204, h.root, "DELETE", "/v1/projects/team-a/r17", nil, nil)
	h.must(401, owner.Token, "GET", "/v1/whoami", nil, nil)
	h.must(201, h.root, "POST", "/v1/projects", model.ProjectRequest{Path: "team-a/r17"}, nil)
	var fresh, parent []model.AuditEntry
	h.must(200, h.root, "GET", "/v1/audit?project=team-a/r17", nil, &fresh)
	h.must(200, h.root, "GET", "/v1/audit?project=team-a", nil, &parent)
	for _, e := range fresh {
		if e.Principal == "owner17" {
			t.Errorf("the new team-a/r17 sees the old one's history: %+v", e)
		}
	}
	if len(parent) <= len(fresh) {
		t.Errorf("the parent lost the deleted project's history: %d entries", len(parent))
	}
	// A flood of refusals is cut off after a burst.
	viewer := h.mint(h.root, model.TokenRequest{Project: "team-b", Role: "viewer", Kind: model.KindAgent, Name: "flood"})
	for range 100 {
		h.call(viewer.Token, "POST", "/v1/projects", model.ProjectRequest{Path: "team-b/x"}, nil)
	}
	var flood []model.AuditEntry
	h.must(200, h.root, "GET", "/v1/audit?project=team-b&action=project.create&limit=1000", nil, &flood)
	if len(flood) > refusalBurst+5 {
		t.Errorf("%d refusals audited from one token in a burst", len(flood))
	}
}
