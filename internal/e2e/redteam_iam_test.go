package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// refusedOutOfScope reports whether err is the API's answer to an object outside the caller's
// scope: 403 naming the permission (or 404), never success, and never naming the project the
// object lives in.
func refusedOutOfScope(err error, hidden string) bool {
	return err != nil && (corral.IsDenied(err) || corral.IsNotFound(err)) && !strings.Contains(err.Error(), hidden)
}

// TestRedTeamCrossProject: a token of project B, even B's owner, uses every sandbox route on a
// sandbox of project A (and of A's subproject). Each is refused as the API promises (403 naming
// the permission, not A), and the sandbox is unchanged: still running, its files as they were, no
// snapshot made, no command run.
func TestRedTeamCrossProject(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	admin := p.Client
	for _, path := range []string{"alpha-team", "alpha-team/run-1", "bravo-team"} {
		if _, err := admin.CreateProject(ctx, path); err != nil {
			t.Fatal(err)
		}
	}
	mint := func(project, role string) *corral.Client {
		tok, err := admin.CreateToken(ctx, corral.TokenRequest{Project: project, Role: role, Kind: "service", Name: "rt-" + randHex(3)})
		if err != nil {
			t.Fatal(err)
		}
		return corral.New(p.URL, tok.Token)
	}
	victims := map[string]*corral.Sandbox{
		"alpha-team":       p.create(corral.CreateRequest{Project: "alpha-team"}),
		"alpha-team/run-1": p.create(corral.CreateRequest{Project: "alpha-team/run-1"}),
	}
	// A subproject's owner cannot reach its parent's sandboxes, nor its sibling's.
	if _, err := admin.CreateProject(ctx, "alpha-team/run-2"); err != nil {
		t.Fatal(err)
	}
	attackers := map[string]*corral.Client{
		"owner of another project":      mint("bravo-team", "owner"),
		"owner of a sibling subproject": mint("alpha-team/run-2", "owner"),
	}

	scopes := map[string]string{"owner of another project": "bravo-team", "owner of a sibling subproject": "alpha-team/run-2"}
	for vp, sb := range victims {
		p.sh(sb.ID, "echo original > /root/f")
		for who, c := range attackers {
			t.Run(who+" on "+vp, func(t *testing.T) {
				// A refusal may name an ancestor of the caller's scope (the caller knows it).
				hidden := vp
				if strings.HasPrefix(scopes[who], vp+"/") {
					hidden = "\x00"
				}
				routes := []struct {
					name string
					call func() error
				}{
					{"get", func() error { _, err := c.GetSandbox(ctx, sb.ID); return err }},
					{"exec", func() error {
						_, _, _, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"/bin/sh", "-c", "echo pwned > /root/f"}})
						return err
					}},
					{"start command", func() error {
						_, err := c.StartCommand(ctx, sb.ID, corral.ExecRequest{Argv: []string{"touch", "/root/pwned"}})
						return err
					}},
					{"commands", func() error { _, err := c.Commands(ctx, sb.ID); return err }},
					{"read file", func() error { _, err := c.ReadFile(ctx, sb.ID, "/root/f"); return err }},
					{"write file", func() error {
						_, err := c.WriteFile(ctx, sb.ID, "/root/f", strings.NewReader("pwned"), corral.WriteFileOptions{})
						return err
					}},
					{"stat", func() error { _, err := c.Stat(ctx, sb.ID, "/root/f"); return err }},
					{"list", func() error { _, err := c.List(ctx, sb.ID, "/root"); return err }},
					{"move", func() error { _, err := c.Move(ctx, sb.ID, "/root/f", "/root/g"); return err }},
					{"remove", func() error { return c.Remove(ctx, sb.ID, "/root/f", false) }},
					{"tar out", func() error { _, err := c.TarOut(ctx, sb.ID, "/root"); return err }},
					{"tar in", func() error { return c.TarIn(ctx, sb.ID, "/root", strings.NewReader("")) }},
					{"trajectory", func() error { _, err := c.Trajectory(ctx, sb.ID, 0); return err }},
					{"pause", func() error { _, err := c.PauseSandbox(ctx, sb.ID); return err }},
					{"resume", func() error { _, err := c.ResumeSandbox(ctx, sb.ID); return err }},
					{"snapshot", func() error {
						_, err := c.Snapshot(ctx, sb.ID, corral.SnapshotRequest{Name: "stolen", Version: "1"})
						return err
					}},
					{"fork", func() error {
						_, err := c.Fork(ctx, sb.ID, corral.ForkRequest{Count: 2, DiskOnly: true})
						return err
					}},
					{"set ttl", func() error { _, err := c.SetTTL(ctx, sb.ID, time.Second); return err }},
					{"set network", func() error {
						_, err := c.SetNetwork(ctx, sb.ID, corral.NetworkPolicy{Mode: corral.NetworkOpen})
						return err
					}},
					{"blocked attempts", func() error { _, err := c.BlockedAttempts(ctx, sb.ID); return err }},
					{"delete", func() error { _, err := c.DeleteSandbox(ctx, sb.ID); return err }},
				}
				for _, r := range routes {
					if err := r.call(); !refusedOutOfScope(err, hidden) {
						t.Errorf("%s: %v; want 403 (or 404) not naming %s", r.name, err, hidden)
					}
				}
				if list, err := c.ListSandboxes(ctx, corral.ListOptions{}); err == nil {
					for _, s := range list {
						if s.ID == sb.ID {
							t.Errorf("the attacker's list shows %s", sb.ID)
						}
					}
				}
			})
		}
		// Nothing changed.
		got, err := admin.GetSandbox(ctx, sb.ID)
		if err != nil || got.State != corral.StateRunning {
			t.Fatalf("victim %s after the attacks: %+v, %v", sb.ID, got, err)
		}
		if out := p.sh(sb.ID, "cat /root/f; ls /root/pwned /root/g 2>/dev/null; true"); out != "original\n" {
			t.Fatalf("victim %s's files after the attacks: %q", sb.ID, out)
		}
		if list, _ := admin.ListSandboxes(ctx, corral.ListOptions{}); slices.ContainsFunc(list, func(s corral.Sandbox) bool { return s.ForkedFrom == sb.ID }) {
			t.Fatalf("a refused fork left a copy of %s", sb.ID)
		}
		if _, err := admin.Layer(ctx, "stolen", "1"); !corral.IsNotFound(err) {
			t.Fatalf("a refused snapshot left a layer: %v", err)
		}
		if cmds, err := admin.Commands(ctx, sb.ID); err != nil || len(cmds) != 2 {
			t.Fatalf("victim %s ran %d commands (%v); want only the test's own 2", sb.ID, len(cmds), err)
		}
	}
}

// TestRedTeamTokenEscalation: holders of a narrow token try to get more than they hold: a token
// with a higher role or more permissions, a longer life, a wider project; a grant of a role above
// their own; a subproject quota above their project's. Each is refused and nothing is made.
func TestRedTeamTokenEscalation(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	admin := p.Client
	for _, path := range []string{"lab", "lab/run"} {
		if _, err := admin.CreateProject(ctx, path); err != nil {
			t.Fatal(err)
		}
	}
	sandboxes := int64(3)
	if _, err := admin.SetQuota(ctx, "lab", corral.Quota{Sandboxes: &sandboxes}); err != nil {
		t.Fatal(err)
	}
	tokenOf := func(req corral.TokenRequest) (*corral.Token, *corral.Client) {
		tok, err := admin.CreateToken(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return tok, corral.New(p.URL, tok.Token)
	}
	userTok, user := tokenOf(corral.TokenRequest{Project: "lab/run", Role: "user", Kind: "agent", Name: "agent", TTL: "1h"})
	_, labAdmin := tokenOf(corral.TokenRequest{Project: "lab", Role: "admin", Kind: "service", Name: "harness", TTL: "2h"})
	cases := []struct {
		name string
		c    *corral.Client
		do   func(c *corral.Client) error
	}{
		{"user mints an admin token", user, func(c *corral.Client) error {
			_, err := c.CreateToken(ctx, corral.TokenRequest{Project: "lab/run", Role: "admin"})
			return err
		}},
		{"user mints an owner token for a new principal", user, func(c *corral.Client) error {
			_, err := c.CreateToken(ctx, corral.TokenRequest{Project: "lab/run", Role: "owner", Kind: "service", Name: "evil"})
			return err
		}},
		{"user mints a token with a permission it lacks", user, func(c *corral.Client) error {
			_, err := c.CreateToken(ctx, corral.TokenRequest{Project: "lab/run", Permissions: []string{"sandbox.use", "sandbox.admin"}})
			return err
		}},
		{"user mints a token for the parent project", user, func(c *corral.Client) error {
			_, err := c.CreateToken(ctx, corral.TokenRequest{Project: "lab", Role: "user"})
			return err
		}},
		{"user mints a token for the root", user, func(c *corral.Client) error {
			_, err := c.CreateToken(ctx, corral.TokenRequest{Project: "/", Role: "viewer"})
			return err
		}},
		{"user grants itself admin", user, func(c *corral.Client) error {
			_, err := c.Grant(ctx, corral.Grant{Project: "lab/run", Principal: "agent", Role: "admin"})
			return err
		}},
		{"user creates a subproject", user, func(c *corral.Client) error {
			_, err := c.CreateProject(ctx, "lab/run/mine")
			return err
		}},
		{"user raises its quota", user, func(c *corral.Client) error {
			n := int64(100)
			_, err := c.SetQuota(ctx, "lab/run", corral.Quota{Sandboxes: &n})
			return err
		}},
		{"admin mints an owner token", labAdmin, func(c *corral.Client) error {
			_, err := c.CreateToken(ctx, corral.TokenRequest{Project: "lab", Role: "owner"})
			return err
		}},
		{"admin grants owner", labAdmin, func(c *corral.Client) error {
			_, err := c.Grant(ctx, corral.Grant{Project: "lab/run", Principal: "agent", Role: "owner"})
			return err
		}},
		{"admin mints a token with operator", labAdmin, func(c *corral.Client) error {
			_, err := c.CreateToken(ctx, corral.TokenRequest{Project: "lab", Permissions: []string{"operator"}})
			return err
		}},
		{"admin mints a token for a sibling project", labAdmin, func(c *corral.Client) error {
			if _, err := admin.CreateProject(ctx, "elsewhere"); err != nil && !corral.IsConflict(err) {
				t.Fatal(err)
			}
			_, err := c.CreateToken(ctx, corral.TokenRequest{Project: "elsewhere", Role: "viewer"})
			return err
		}},
		{"admin sets a subproject quota above the parent's", labAdmin, func(c *corral.Client) error {
			n := int64(10)
			_, err := c.SetQuota(ctx, "lab/run", corral.Quota{Sandboxes: &n})
			return err
		}},
		{"admin raises its own project's quota", labAdmin, func(c *corral.Client) error {
			n := int64(100)
			_, err := c.SetQuota(ctx, "lab", corral.Quota{Sandboxes: &n})
			return err
		}},
		{"admin moves its project out of reach", labAdmin, func(c *corral.Client) error {
			_, err := c.MoveProject(ctx, corral.MoveProjectRequest{From: "lab/run", To: "elsewhere/run"})
			return err
		}},
		{"admin deletes its own project", labAdmin, func(c *corral.Client) error { return c.DeleteProject(ctx, "lab", true) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do(tc.c)
			if err == nil {
				t.Fatalf("succeeded")
			}
			if !corral.IsDenied(err) && !corral.IsInvalid(err) && !corral.IsExhausted(err) && !corral.IsConflict(err) {
				t.Fatalf("%v; want a refusal (403, 400, 409 or 429)", err)
			}
		})
	}
	// A token asking to outlive the one that mints it is cut to the minter's expiry.
	t.Run("user mints a token outliving its own", func(t *testing.T) {
		tok, err := user.CreateToken(ctx, corral.TokenRequest{Project: "lab/run", Role: "user", TTL: "720h"})
		if err == nil && (tok.ExpiresAt == nil || tok.ExpiresAt.After(*userTok.ExpiresAt)) {
			t.Fatalf("minted a token expiring %v, after its minter's %v", tok.ExpiresAt, userTok.ExpiresAt)
		}
	})
	// Nothing was made: no new principal, grant, project, or quota change.
	principals, err := admin.Principals(ctx, "lab/run")
	for _, pr := range principals {
		if pr.Name == "evil" {
			t.Errorf("a refused mint made the principal %+v", pr)
		}
	}
	grants, err := admin.Grants(ctx, "lab")
	for _, g := range grants {
		if g.Role == "owner" || (g.Principal == "agent" && g.Role != "user") {
			t.Errorf("a grant was made: %+v", g)
		}
	}
	if q, err := admin.Quota(ctx, "lab"); err != nil || q.Limit.Sandboxes == nil || *q.Limit.Sandboxes != 3 {
		t.Errorf("lab's quota after the attempts: %+v, %v", q, err)
	}
	if q, err := admin.Quota(ctx, "lab/run"); err == nil && q.Limit.Sandboxes != nil && *q.Limit.Sandboxes > 3 {
		t.Errorf("lab/run's quota after the attempts: %+v", q.Limit)
	}
	if _, err := admin.Project(ctx, "lab/run/mine"); !corral.IsNotFound(err) {
		t.Errorf("a refused subproject exists: %v", err)
	}
	if _, err := admin.Project(ctx, "lab/run"); err != nil {
		t.Errorf("lab/run after the attempts: %v", err)
	}
	if err != nil {
		t.Error(err)
	}
}
