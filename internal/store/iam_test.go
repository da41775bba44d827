package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
)

func ptr[T any](v T) *T { return &v }

func mustProject(t *testing.T, s *Store, path string) *ProjectRecord {
	t.Helper()
	p, err := s.CreateProject(context.Background(), path, "root")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var sbSeq atomic.Int64

func newRecord(projectID string, cpus float64) *Sandbox {
	now := time.Now().UTC()
	return &Sandbox{
		Sandbox: model.Sandbox{
			ID: fmt.Sprintf("sb-test-%016d", sbSeq.Add(1)), Node: "test", Tier: "container", State: model.StateCreating,
			Limits: model.Limits{CPUs: cpus, MemoryBytes: 64 << 20}, CreatedAt: now, ExpiresAt: now.Add(time.Hour),
		},
		ProjectID: projectID,
	}
}

// TestConcurrentAdmission is the check: 200 parallel creates against a quota of 50 admit
// exactly 50, every time. The quota sits on an ancestor, so the check is the ancestor's.
func TestConcurrentAdmission(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		for round := range 5 {
			s := open(t)
			mustProject(t, s, "team")
			leaf := mustProject(t, s, "team/rollout")
			if _, err := s.SetQuota(ctx, "team", model.Quota{Sandboxes: ptr[int64](50)}); err != nil {
				t.Fatal(err)
			}
			var admitted, refused atomic.Int64
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range 200 {
				wg.Go(func() {
					<-start
					err := s.AdmitSandbox(ctx, newRecord(leaf.ID, 0), nil)
					var qe *iam.QuotaError
					switch {
					case err == nil:
						admitted.Add(1)
					case errors.As(err, &qe) && errors.Is(err, errdefs.ErrExhausted):
						if qe.Project != "team" || qe.Resource != "sandboxes" || qe.Limit != 50 || qe.Usage != 50 {
							t.Errorf("refusal %+v", qe.QuotaExceeded)
						}
						refused.Add(1)
					default:
						t.Errorf("admit: %v", err)
					}
				})
			}
			close(start)
			wg.Wait()
			if admitted.Load() != 50 || refused.Load() != 150 {
				t.Fatalf("round %d: admitted %d, refused %d; want 50 and 150", round, admitted.Load(), refused.Load())
			}
			q, err := s.GetQuota(ctx, "team")
			if err != nil || q.Usage.Sandboxes != 50 || q.Usage.CreatesPerMinute != 50 {
				t.Fatalf("usage %+v, %v", q, err)
			}
		}
	})
}

func TestQuotaResources(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		p := mustProject(t, s, "p")
		if _, err := s.SetQuota(ctx, "p", model.Quota{CPUs: ptr(2.0), Tiers: map[string]int64{"container": 5}, CreatesPerMinute: ptr[int64](4)}); err != nil {
			t.Fatal(err)
		}
		a := newRecord(p.ID, 1.5)
		if err := s.AdmitSandbox(ctx, a, nil); err != nil {
			t.Fatal(err)
		}
		var qe *iam.QuotaError
		if err := s.AdmitSandbox(ctx, newRecord(p.ID, 1), nil); !errors.As(err, &qe) || qe.Resource != "cpus" || qe.Usage != 1.5 || qe.Request != 1 {
			t.Fatalf("over the CPU limit: %v", err)
		}
		// A stopped sandbox frees its share; creations in the last minute still count.
		a.State = model.StateStopped
		if err := s.PutSandbox(ctx, a); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := s.AdmitSandbox(ctx, newRecord(p.ID, 0.5), nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.AdmitSandbox(ctx, newRecord(p.ID, 0.1), nil); !errors.As(err, &qe) || qe.Resource != "creates_per_minute" {
			t.Fatalf("over the creation rate: %v", err)
		}
		if err := ValidateQuota(model.Quota{Sandboxes: ptr[int64](-1)}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("negative limit: %v", err)
		}
		if err := ValidateQuota(model.Quota{Tiers: map[string]int64{"mainframe": 1}}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("unknown tier: %v", err)
		}
	})
}

// TestDelegation checks the delegation bounds: children's limits never sum past the parent's,
// and a parent cannot drop below what its children hold.
func TestDelegation(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		mustProject(t, s, "a")
		mustProject(t, s, "a/x")
		mustProject(t, s, "a/y")
		if _, err := s.SetQuota(ctx, "a", model.Quota{Sandboxes: ptr[int64](10), MemoryBytes: ptr[int64](1 << 30)}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.SetQuota(ctx, "a/x", model.Quota{Sandboxes: ptr[int64](6)}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.SetQuota(ctx, "a/y", model.Quota{Sandboxes: ptr[int64](5)}); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("6 + 5 > 10 was accepted: %v", err)
		}
		q, err := s.SetQuota(ctx, "a/y", model.Quota{Sandboxes: ptr[int64](4)})
		if err != nil {
			t.Fatal(err)
		}
		if *q.Limit.Sandboxes != 4 {
			t.Errorf("limit %+v", q.Limit)
		}
		// Raising x again (replacing its own 6) fits only within what y leaves.
		if _, err := s.SetQuota(ctx, "a/x", model.Quota{Sandboxes: ptr[int64](7)}); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("7 + 4 > 10 was accepted: %v", err)
		}
		if _, err := s.SetQuota(ctx, "a", model.Quota{Sandboxes: ptr[int64](9)}); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("a parent dropped below its children's 10: %v", err)
		}
		got, err := s.GetQuota(ctx, "a")
		if err != nil || *got.Delegated.Sandboxes != 10 {
			t.Fatalf("delegated %+v, %v", got, err)
		}
		// A move carries the quota: z under a must fit what a can still delegate (nothing).
		mustProject(t, s, "b")
		mustProject(t, s, "b/z")
		if _, err := s.SetQuota(ctx, "b/z", model.Quota{Sandboxes: ptr[int64](1)}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.MoveProject(ctx, "b/z", "a/z", false); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("a move past the new parent's quota: %v", err)
		}
	})
}

func TestProjectMoveAndDelete(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		mustProject(t, s, "a")
		b := mustProject(t, s, "a/b")
		mustProject(t, s, "a/b/c")
		mustProject(t, s, "a-b")
		if _, err := s.CreateProject(ctx, "x/y", "root"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("created under a missing parent: %v", err)
		}
		if _, err := s.CreateProject(ctx, "a/b", "root"); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("created twice: %v", err)
		}
		sb := newRecord(b.ID, 0)
		if err := s.AdmitSandbox(ctx, sb, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := s.MoveProject(ctx, "a/b", "a/b/c/d", true); !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("moved into itself: %v", err)
		}
		if _, err := s.MoveProject(ctx, "a/b", "n", false); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("moved with a live sandbox: %v", err)
		}
		if _, err := s.MoveProject(ctx, "a/b", "n", true); err != nil {
			t.Fatal(err)
		}
		list, err := s.ListProjects(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		var paths []string
		for _, p := range list {
			paths = append(paths, p.Path)
		}
		if fmt.Sprint(paths) != "[/ a a-b n n/c]" {
			t.Fatalf("after the move: %v", paths)
		}
		if got, err := s.GetSandbox(ctx, sb.ID); err != nil || got.Project != "n" || got.ProjectID != b.ID {
			t.Fatalf("the sandbox follows its project: %+v, %v", got, err)
		}
		if err := s.DeleteProject(ctx, "n"); !errors.Is(err, errdefs.ErrConflict) {
			t.Fatalf("deleted with a live sandbox: %v", err)
		}
		sb.State = model.StateStopped
		if err := s.PutSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
		if err := s.CreatePrincipal(ctx, model.Principal{Name: "bot", Kind: model.KindAgent}, "n/c", "root"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteProject(ctx, "n"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetPrincipal(ctx, "bot"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("a principal outlived its project: %v", err)
		}
		if got, err := s.GetSandbox(ctx, sb.ID); err != nil || got.Project != "/" {
			t.Errorf("a deleted project's stopped sandbox: %+v, %v", got, err)
		}
		if err := s.DeleteProject(ctx, ""); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("deleted the root: %v", err)
		}
	})
}

func TestTokenLifecycle(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		p := mustProject(t, s, "p")
		if err := s.AddRootToken(ctx, "h-root"); err != nil {
			t.Fatal(err)
		}
		root, err := s.TokenByHash(ctx, "h-root")
		if err != nil {
			t.Fatal(err)
		}
		userPerms, _ := iam.RolePerms(model.RoleUser)
		mint := func(id, hash, parent string, np *model.Principal) {
			t.Helper()
			m := MintRequest{Token: TokenRecord{ID: id, Hash: hash, Principal: "root", ProjectID: p.ID, Perms: userPerms, Role: "user", Parent: parent}, CreatedBy: "root"}
			if np != nil {
				m.Token.Principal, m.NewPrincipalKind, m.GrantRole = np.Name, np.Kind, "user"
			}
			if err := s.MintToken(ctx, m); err != nil {
				t.Fatal(err)
			}
		}
		mint("tok-a", "h-a", root.ID, &model.Principal{Name: "agent-1", Kind: model.KindAgent})
		mint("tok-b", "h-b", "tok-a", nil)
		mint("tok-c", "h-c", "tok-b", nil)
		got, err := s.TokenByHash(ctx, "h-c")
		if err != nil || got.ProjectPath != "p" || got.Perms != userPerms || got.Parent != "tok-b" {
			t.Fatalf("minted token %+v, %v", got, err)
		}
		grants, err := s.PrincipalGrants(ctx, "agent-1", "p")
		if err != nil || len(grants) != 1 || grants[0].Role != "user" || grants[0].ProjectPath != "p" {
			t.Fatalf("the new principal's grants: %+v, %v", grants, err)
		}
		if err := s.MintToken(ctx, MintRequest{Token: TokenRecord{ID: "tok-d", Hash: "h-d", Principal: "nobody", ProjectID: p.ID}}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("minted for a missing principal: %v", err)
		}
		// A new principal by its kind alone (the E2B gateway's service): named by the token.
		if err := s.MintToken(ctx, MintRequest{Token: TokenRecord{ID: "tok-s", Hash: "h-s", Principal: "svc-1", ProjectID: p.ID, Perms: userPerms, Role: "user"},
			NewPrincipalKind: iam.KindService, GrantRole: "user", CreatedBy: "root"}); err != nil {
			t.Fatal(err)
		}
		if pr, err := s.GetPrincipal(ctx, "svc-1"); err != nil || pr.Kind != iam.KindService || pr.Project != "p" || pr.CreatedBy != "root" {
			t.Fatalf("the principal minted by kind: %+v, %v", pr, err)
		}
		if grants, err := s.PrincipalGrants(ctx, "svc-1", "p"); err != nil || len(grants) != 1 || grants[0].Role != "user" {
			t.Fatalf("its grants: %+v, %v", grants, err)
		}
		desc, err := s.ListTokens(ctx, TokenFilter{Ancestor: "tok-a"})
		if err != nil || len(desc) != 2 {
			t.Fatalf("descendants of tok-a: %d, %v", len(desc), err)
		}
		// Revoking a token revokes what was minted from it, and nothing above.
		if _, err := s.RevokeToken(ctx, "tok-a"); err != nil {
			t.Fatal(err)
		}
		for hash, revoked := range map[string]bool{"h-a": true, "h-b": true, "h-c": true, "h-root": false} {
			got, err := s.TokenByHash(ctx, hash)
			if err != nil || got.RevokedAt.IsZero() == revoked {
				t.Errorf("token %s: revoked at %v, %v", hash, got.RevokedAt, err)
			}
		}
		if _, err := s.RevokeToken(ctx, "tok-zzz"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("revoked a missing token: %v", err)
		}
	})
}

func TestAudit(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		mustProject(t, s, "a")
		mustProject(t, s, "a/b")
		mustProject(t, s, "c")
		old := time.Now().Add(-48 * time.Hour)
		for i, e := range []model.AuditEntry{
			{At: old, Project: "a", Action: "project.create", Result: "ok"},
			{At: time.Now(), Project: "a/b", Action: "sandbox.create", Target: "sb-1", Result: "ok"},
			{At: time.Now(), Project: "c", Action: "sandbox.create", Result: "exhausted"},
			{At: time.Now(), Project: "a/b", Action: "sandbox.delete", Target: "sb-1", Result: "ok"},
		} {
			e.Principal = fmt.Sprint("p", i)
			if err := s.AddAudit(ctx, e, ""); err != nil {
				t.Fatal(err)
			}
		}
		list, err := s.ListAudit(ctx, "a", model.AuditQuery{})
		if err != nil || len(list) != 3 || list[0].Action != "sandbox.delete" || list[2].Project != "a" {
			t.Fatalf("audit of a: %+v, %v", list, err)
		}
		list, _ = s.ListAudit(ctx, "", model.AuditQuery{Action: "sandbox."})
		if len(list) != 3 {
			t.Fatalf("sandbox actions: %+v", list)
		}
		list, _ = s.ListAudit(ctx, "", model.AuditQuery{Limit: 1, Before: list[0].ID})
		if len(list) != 1 || list[0].Project != "c" {
			t.Fatalf("paging: %+v", list)
		}
		// Entries of a deleted project stay under its old path.
		if err := s.DeleteProject(ctx, "a/b"); err != nil {
			t.Fatal(err)
		}
		if list, _ := s.ListAudit(ctx, "a", model.AuditQuery{}); len(list) != 3 {
			t.Fatalf("after deleting a/b: %+v", list)
		}
		if n, err := s.PruneAudit(ctx, time.Now().Add(-24*time.Hour)); err != nil || n != 1 {
			t.Fatalf("prune: %d, %v", n, err)
		}
	})
}

// TestUsageCounters checks that the counters admission reads stay equal to a recount from the
// sandbox rows through admissions, state changes, limit changes and moves.
func TestUsageCounters(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		a := mustProject(t, s, "a")
		b := mustProject(t, s, "a/b")
		mustProject(t, s, "c")
		var recs []*Sandbox
		for i, pid := range []string{a.ID, b.ID, b.ID, RootProjectID} {
			r := newRecord(pid, 0.25*float64(i+1))
			if i == 3 {
				r.Tier = "fncall"
			}
			if err := s.AdmitSandbox(ctx, r, nil); err != nil {
				t.Fatal(err)
			}
			recs = append(recs, r)
		}
		recs[0].State = model.StateRunning // live to live: no change
		recs[1].State = model.StatePaused
		recs[2].State = model.StateFailed // leaves
		for _, r := range recs[:3] {
			if err := s.PutSandbox(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.MoveProject(ctx, "a/b", "c/b", true); err != nil {
			t.Fatal(err)
		}
		snapshot := func() map[string]model.Usage {
			out := map[string]model.Usage{}
			for _, p := range []string{"", "a", "c", "c/b"} {
				q, err := s.GetQuota(ctx, p)
				if err != nil {
					t.Fatal(err)
				}
				q.Usage.CreatesPerMinute = 0
				out[p] = q.Usage
			}
			return out
		}
		got := snapshot()
		if got[""].Sandboxes != 3 || got["a"].Sandboxes != 1 || got["c"].Sandboxes != 1 || got["c/b"].Sandboxes != 1 ||
			got[""].CPUs != 0.25+0.5+1 || got[""].Tiers["fncall"] != 1 || got["c"].Tiers["container"] != 1 || got["a"].CPUs != 0.25 {
			t.Fatalf("counters %+v", got)
		}
		if err := s.RecountUsage(ctx); err != nil {
			t.Fatal(err)
		}
		if again := snapshot(); fmt.Sprint(again) != fmt.Sprint(got) {
			t.Fatalf("recount %+v differs from the counters %+v", again, got)
		}
	})
}

// TestDeleteProjectHandsNothingSideways checks what a deleted project leaves: its layers pass to
// the parent as private (no sibling gains them), and every token minted from its tokens ends too.
func TestDeleteProjectHandsNothingSideways(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		mustProject(t, s, "a")
		r := mustProject(t, s, "a/r17")
		mustProject(t, s, "a/r18")
		if _, _, err := s.PublishLayer(ctx, model.Layer{Name: "snap", Version: "1", Kind: model.KindSnapshot, Digest: "sha256:" + strings.Repeat("ab", 32), Project: "a/r17", CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		userPerms, _ := iam.RolePerms(model.RoleUser)
		if err := s.MintToken(ctx, MintRequest{Token: TokenRecord{ID: "tok-in", Hash: "h-in", Principal: "agent", ProjectID: r.ID, Perms: userPerms},
			NewPrincipalKind: model.KindAgent, GrantRole: "user"}); err != nil {
			t.Fatal(err)
		}
		// A token minted from the agent's (scoped inside too) ends with it.
		if err := s.MintToken(ctx, MintRequest{Token: TokenRecord{ID: "tok-child", Hash: "h-child", Principal: "agent", ProjectID: r.ID, Perms: userPerms, Parent: "tok-in"}}); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteProject(ctx, "a/r17"); err != nil {
			t.Fatal(err)
		}
		l, err := s.GetLayer(ctx, "snap", "1")
		if err != nil || l.Project != "a" || !l.Private {
			t.Fatalf("the layer after its project's deletion: %+v, %v", l, err)
		}
		if iam.LayerVisible("a", l.Private, l.Public, "a/r18") {
			t.Error("a sibling can use the deleted project's layer")
		}
		for _, id := range []string{"tok-in", "tok-child"} {
			if tok, err := s.GetToken(ctx, id); err == nil && tok.RevokedAt.IsZero() {
				t.Errorf("token %s survived its project", id)
			}
		}
	})
}

// TestForcedMoveKeepsQuotas checks that forcing a move with live sandboxes still respects the
// quotas of the ancestors the subtree joins.
func TestForcedMoveKeepsQuotas(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		mustProject(t, s, "a")
		mustProject(t, s, "a/r17")
		mustProject(t, s, "a/r18")
		s1 := mustProject(t, s, "a/r17/s1")
		for _, p := range []string{"a/r17", "a/r18"} {
			if _, err := s.SetQuota(ctx, p, model.Quota{Sandboxes: ptr[int64](2)}); err != nil {
				t.Fatal(err)
			}
		}
		for range 2 {
			if err := s.AdmitSandbox(ctx, newRecord(s1.ID, 0), nil); err != nil {
				t.Fatal(err)
			}
		}
		r18 := mustProject(t, s, "a/r18/busy")
		if err := s.AdmitSandbox(ctx, newRecord(r18.ID, 0), nil); err != nil {
			t.Fatal(err)
		}
		var qe *iam.QuotaError
		if _, err := s.MoveProject(ctx, "a/r17/s1", "a/r18/s1", true); !errors.As(err, &qe) || qe.Project != "a/r18" {
			t.Fatalf("a forced move past a/r18's quota: %v", err)
		}
	})
}

// TestIdempotentAdmission checks that concurrent creates with one idempotency key make one
// sandbox, the others learning its ID, and that the key cannot be reused for another request.
func TestIdempotentAdmission(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		key := &Idempotency{Principal: "root", Key: "retry-1", RequestHash: "h1"}
		var mu sync.Mutex
		made := map[string]int{}
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				rec := newRecord(RootProjectID, 0)
				err := s.AdmitSandbox(ctx, rec, key)
				mu.Lock()
				defer mu.Unlock()
				var re *ReplayError
				switch {
				case err == nil:
					made["new:"+rec.ID]++
				case errors.As(err, &re):
					made["replay:"+re.SandboxID]++
				default:
					t.Errorf("admit: %v", err)
				}
			})
		}
		wg.Wait()
		var first string
		for k := range made {
			if id, ok := strings.CutPrefix(k, "new:"); ok {
				if first != "" {
					t.Fatalf("two sandboxes for one key: %v", made)
				}
				first = id
			}
		}
		if first == "" || made["replay:"+first] != 19 || len(made) != 2 {
			t.Fatalf("admissions: %v", made)
		}
		if err := s.CheckIdempotency(ctx, key); !errors.As(err, new(*ReplayError)) {
			t.Errorf("check after: %v", err)
		}
		other := &Idempotency{Principal: "root", Key: "retry-1", RequestHash: "h2"}
		if err := s.AdmitSandbox(ctx, newRecord(RootProjectID, 0), other); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("the key with another request: %v", err)
		}
		// Keys are per principal.
		if err := s.AdmitSandbox(ctx, newRecord(RootProjectID, 0), &Idempotency{Principal: "agent", Key: "retry-1", RequestHash: "h2"}); err != nil {
			t.Errorf("another principal's key: %v", err)
		}
		if n, err := s.PruneIdempotency(ctx); err != nil || n != 0 {
			t.Errorf("prune of fresh keys: %d, %v", n, err)
		}
	})
}

// TestAddAudits: a batch of entries is written whole, with text that is not UTF-8 replaced (as
// control characters are), on both drivers.
func TestAddAudits(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		now := time.Now().UTC()
		ws := []AuditWrite{
			{Entry: model.AuditEntry{At: now, Principal: "root", Action: "sandbox.delete", Target: "sb-a", Result: "ok", Detail: "bad \xff byte"}},
			{Entry: model.AuditEntry{At: now, Principal: "root", Action: "sandbox.delete", Target: "sb-b", Result: "ok"}},
		}
		if err := s.AddAudits(ctx, ws); err != nil {
			t.Fatal(err)
		}
		got, err := s.ListAudit(ctx, "", model.AuditQuery{Action: "sandbox.delete"})
		if err != nil || len(got) != 2 {
			t.Fatalf("entries: %+v, %v", got, err)
		}
		for _, e := range got {
			if e.Target == "sb-a" && e.Detail != "bad ? byte" {
				t.Errorf("detail with a byte that is not UTF-8: %q", e.Detail)
			}
		}
	})
}
