package e2e

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/corral-dev/corral/internal/store/pgtest"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TestAgentRolloutCLI is the identity issue's story end to end, with the CLI against a real
// corral up: a harness holding a project token makes a subproject for one rollout, delegates it
// quota, mints an agent token scoped to it and hands it over; the agent creates and uses
// sandboxes only there and cannot see or touch anything above or beside it.
func TestAgentRolloutCLI(t *testing.T) {
	p := withBase(t)
	as := func(token string, args ...string) (string, string, int) {
		t.Helper()
		return p.cliAs(token, "", "", args...)
	}
	ok := func(token string, args ...string) string {
		t.Helper()
		out, errOut, code := as(token, args...)
		if code != 0 {
			t.Fatalf("corral %s: exit %d: %s", strings.Join(args, " "), code, errOut)
		}
		return out
	}
	refused := func(token, why string, args ...string) string {
		t.Helper()
		_, errOut, code := as(token, args...)
		if code == 0 || !strings.Contains(errOut, why) {
			t.Fatalf("corral %s: exit %d, stderr %q; want a refusal saying %q", strings.Join(args, " "), code, errOut, why)
		}
		return errOut
	}
	mint := func(token string, args ...string) corral.Token {
		t.Helper()
		var tok corral.Token
		if err := json.Unmarshal([]byte(ok(token, append([]string{"token", "create", "-o", "json"}, args...)...)), &tok); err != nil || tok.Token == "" {
			t.Fatalf("token create: %+v, %v", tok, err)
		}
		return tok
	}
	admin := p.Token
	ok(admin, "project", "create", "team-a")
	ok(admin, "quota", "set", "team-a", "--sandboxes", "20", "--memory", "8G")
	harness := mint(admin, "--project", "team-a", "--role", "owner", "--kind", "service", "--name", "harness")

	// The harness makes a project for one rollout, delegates it 2 sandboxes, and mints an agent.
	ok(harness.Token, "project", "create", "team-a/rollout-17")
	ok(harness.Token, "quota", "set", "team-a/rollout-17", "--sandboxes", "2")
	refused(harness.Token, "project.create", "project", "create", "elsewhere")
	refused(harness.Token, "quota.delegate", "quota", "set", "team-a", "--sandboxes", "100")
	agent := mint(harness.Token, "--project", "team-a/rollout-17", "--role", "user", "--kind", "agent", "--ttl", "2h")
	ak := agent.Token

	// The agent creates sandboxes in its project by default, and uses them.
	var ids []string
	for range 2 {
		var sb corral.Sandbox
		if err := json.Unmarshal([]byte(ok(ak, "create", "--base", "base:test", "--memory", "64M", "-o", "json")), &sb); err != nil {
			t.Fatal(err)
		}
		if sb.Project != "team-a/rollout-17" {
			t.Fatalf("the agent's sandbox is in %q", sb.Project)
		}
		ids = append(ids, sb.ID)
	}
	if out := ok(ak, "exec", ids[0], "--", "echo", "agent-was-here"); !strings.Contains(out, "agent-was-here") {
		t.Fatalf("exec: %q", out)
	}
	// The third goes over the delegated quota: 429 naming the limit, usage and project.
	msg := refused(ak, "team-a/rollout-17", "create", "--base", "base:test")
	if !strings.Contains(msg, "sandboxes") || !strings.Contains(msg, "2") {
		t.Errorf("quota refusal: %s", msg)
	}
	// Nothing above or beside is visible or touchable.
	other := p.create(corral.CreateRequest{})
	var seen []corral.Sandbox
	if err := json.Unmarshal([]byte(ok(ak, "ls", "-o", "json")), &seen); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 {
		t.Fatalf("the agent lists %d sandboxes, want its 2: %+v", len(seen), seen)
	}
	refused(ak, "sandbox.read", "get", other.ID)
	refused(ak, "sandbox.use", "exec", other.ID, "--", "true")
	refused(ak, "sandbox.admin", "rm", other.ID)
	refused(ak, "sandbox.admin", "rm", ids[0]) // user creates and uses; deleting is admin's
	refused(ak, "project.create", "project", "create", "team-a/rollout-17/sub")
	refused(ak, "quota.delegate", "quota", "set", "team-a/rollout-17", "--sandboxes", "100")
	refused(ak, "sandbox.create", "create", "--base", "base:test", "--project", "team-a")
	refused(ak, "sandbox.admin", "token", "create", "--project", "team-a/rollout-17", "--role", "admin")
	var tree struct {
		Path     string `json:"path"`
		Children []any  `json:"children"`
	}
	if err := json.Unmarshal([]byte(ok(ak, "project", "tree", "-o", "json")), &tree); err != nil || tree.Path != "team-a/rollout-17" || len(tree.Children) != 0 {
		t.Fatalf("the agent's tree: %+v, %v", tree, err)
	}

	// The harness sees its whole subtree in the audit log, with the agent as principal.
	var entries []corral.AuditEntry
	if err := json.Unmarshal([]byte(ok(harness.Token, "audit", "--project", "team-a", "-o", "json")), &entries); err != nil {
		t.Fatal(err)
	}
	var creates, exhausted int
	for _, e := range entries {
		if e.Action == "sandbox.create" && e.Principal == agent.Principal {
			creates++
			if e.Result == "exhausted" {
				exhausted++
			}
		}
	}
	if creates < 3 || exhausted < 1 {
		t.Errorf("audit: %d agent creates, %d refused by quota: %+v", creates, exhausted, entries)
	}
	refused(ak, "audit.read", "audit")

	// Revoking the agent's token locks it out at once.
	ok(harness.Token, "token", "revoke", agent.ID)
	refused(ak, "revoked", "ls")

	// A project with live sandboxes is deleted only by force, which deletes them.
	refused(harness.Token, "live sandboxes", "project", "rm", "team-a/rollout-17")
	ok(harness.Token, "project", "rm", "--force", "team-a/rollout-17")
	for _, id := range ids {
		if sb := waitEnded(t, p.Client, id); sb.State != corral.StateStopped {
			t.Errorf("sandbox %s of the deleted project: %+v", id, sb)
		}
	}
}

// TestConcurrentAdmissionAPI sends parallel creates through the real API against a project's
// quota: exactly the quota is admitted, the rest get 429 with the limit, usage and project.
func TestConcurrentAdmissionAPI(t *testing.T) {
	p := withBase(t)
	ctx := t.Context()
	if _, err := p.Client.CreateProject(ctx, "burst"); err != nil {
		t.Fatal(err)
	}
	limit := int64(5)
	if _, err := p.Client.SetQuota(ctx, "burst", corral.Quota{Sandboxes: &limit}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var admitted []string
	var refused int
	var wg sync.WaitGroup
	for range 30 {
		wg.Go(func() {
			sb, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Project: "burst", Limits: corral.Limits{MemoryBytes: 64 << 20}})
			mu.Lock()
			defer mu.Unlock()
			var apiErr *corral.APIError
			switch {
			case err == nil:
				admitted = append(admitted, sb.ID)
			case errors.As(err, &apiErr) && apiErr.Status == 429 && apiErr.Quota != nil:
				if q := apiErr.Quota; q.Project != "burst" || q.Resource != "sandboxes" || q.Limit != 5 || q.Usage != 5 {
					t.Errorf("refusal %+v", q)
				}
				refused++
			default:
				t.Errorf("create: %v", err)
			}
		})
	}
	wg.Wait()
	if len(admitted) != 5 || refused != 25 {
		t.Fatalf("admitted %d, refused %d; want 5 and 25", len(admitted), refused)
	}
	q, err := p.Client.Quota(ctx, "burst")
	if err != nil || q.Usage.Sandboxes != 5 {
		t.Fatalf("usage %+v, %v", q, err)
	}
	for _, id := range admitted {
		if _, err := p.Client.DeleteSandbox(ctx, id); err != nil {
			t.Error(err)
		}
	}
	if q, err := p.Client.Quota(ctx, "burst"); err != nil || q.Usage.Sandboxes != 0 {
		t.Fatalf("usage after delete %+v, %v", q, err)
	}
}

// TestPostgresStore runs corral up on a PostgreSQL store: identity, quotas and sandboxes work
// as on SQLite, and a kill -9 and restart keep everything.
func TestPostgresStore(t *testing.T) {
	needRoot(t)
	dsn := pgtest.NewDB(t)
	p := withBase(t, "--store", dsn)
	ctx := t.Context()
	if _, err := p.Client.CreateProject(ctx, "team"); err != nil {
		t.Fatal(err)
	}
	limit := int64(1)
	if _, err := p.Client.SetQuota(ctx, "team", corral.Quota{Sandboxes: &limit}); err != nil {
		t.Fatal(err)
	}
	sb := p.create(corral.CreateRequest{Project: "team"})
	if _, err := p.Client.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Project: "team"}); !isQuota(err) {
		t.Fatalf("second sandbox over a quota of 1: %v", err)
	}
	p.sh(sb.ID, "echo kept > /root/state")
	p.Kill9()
	p.Restart()
	if got := p.sh(sb.ID, "cat /root/state"); got != "kept\n" {
		t.Fatalf("after restart: %q", got)
	}
	q, err := p.Client.Quota(ctx, "team")
	if err != nil || q.Usage.Sandboxes != 1 {
		t.Fatalf("usage after restart %+v, %v", q, err)
	}
	if _, err := os.Stat(filepath.Join(p.DataDir, "corral.db")); err == nil {
		t.Error("a SQLite file was made beside the PostgreSQL store")
	}
}

func isQuota(err error) bool {
	var apiErr *corral.APIError
	return errors.As(err, &apiErr) && apiErr.Status == 429 && apiErr.Quota != nil
}

// TestIdempotentCreate retries one create many times at once, as a client whose requests timed
// out would: one sandbox is made, every answer names it, and the key cannot make another.
func TestIdempotentCreate(t *testing.T) {
	p := withBase(t)
	ctx := t.Context()
	req := corral.CreateRequest{Base: "base:test", Labels: map[string]string{"try": "1"}, IdempotencyKey: "job-42-create"}
	ids := make(chan string, 10)
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			sb, err := p.Client.CreateSandbox(ctx, req)
			if err != nil {
				t.Error(err)
				return
			}
			ids <- sb.ID
		})
	}
	wg.Wait()
	close(ids)
	var first string
	for id := range ids {
		if first == "" {
			first = id
		} else if id != first {
			t.Fatalf("two sandboxes for one key: %s and %s", first, id)
		}
	}
	list, err := p.Client.ListSandboxes(ctx, corral.ListOptions{Labels: map[string]string{"try": "1"}})
	if err != nil || len(list) != 1 {
		t.Fatalf("sandboxes made: %d, %v", len(list), err)
	}
	defer p.Client.DeleteSandbox(ctx, first)
	other := req
	other.Labels = map[string]string{"try": "2"}
	if _, err := p.Client.CreateSandbox(ctx, other); !corral.IsConflict(err) {
		t.Fatalf("the key with another request: %v", err)
	}
	// The CLI takes the key too.
	out, errOut, code := p.cli("", "create", "--base", "base:test", "--label", "try=1", "--idempotency-key", "job-42-create")
	if code != 0 || strings.TrimSpace(out) != first {
		t.Fatalf("corral create with the key: %q %q %d, want %s", out, errOut, code, first)
	}
}
