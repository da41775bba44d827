package cluster

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/nodeproto"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TestNodeAudit: an edge's audit entries are written by the servers as the caller they sealed
// for the edge (its principal and token, whatever the entry says), only with such a caller, and
// within bounds.
func TestNodeAudit(t *testing.T) {
	ctx := context.Background()
	st, srv, hs, dir := nodeChannelReplica(t)
	j, err := Join(ctx, hs.URL, filepath.Join(dir, "join.token"), "edge1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Servers.Register(ctx, nodeproto.RegisterRequest{URL: "https://127.0.0.1:1", Protocol: nodeproto.Version, LeaseTTLMillis: 15000}); err != nil {
		t.Fatal(err)
	}
	aud := j.Servers.Auditor()
	caller := sealedFor(t, ctx, "edge1", map[string]iam.Perm{"": iam.SandboxAdmin}, srv.sealer)
	entry := corral.AuditEntry{At: time.Now().UTC(), Principal: "someone-else", Token: "tok-forged", Project: "", Action: "sandbox.delete", Target: "sb-edge1-aaaaaaaaaaaaaaaa", Result: "ok"}

	if err := aud.AddAudit(ctx, entry, ""); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("an entry without a caller: %v, want ErrDenied", err)
	}
	if err := aud.AddAudit(sealedFor(t, ctx, "edge2", map[string]iam.Perm{"": iam.SandboxAdmin}, srv.sealer), entry, ""); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("an entry for a caller sealed for another node: %v, want ErrDenied", err)
	}
	for _, c := range []struct {
		field string
		edit  func(e *corral.AuditEntry)
	}{
		{"entry.action", func(e *corral.AuditEntry) { e.Action = "" }},
		{"entry.result", func(e *corral.AuditEntry) { e.Result = strings.Repeat("x", 33) }},
		{"entry.target", func(e *corral.AuditEntry) { e.Target = strings.Repeat("x", 257) }},
		{"entry.detail", func(e *corral.AuditEntry) { e.Detail = strings.Repeat("x", 1025) }},
		{"entry.at", func(e *corral.AuditEntry) { e.At = time.Now().Add(-time.Hour) }},
	} {
		e := entry
		c.edit(&e)
		if err := aud.AddAudit(caller, e, ""); !errors.Is(err, errdefs.ErrInvalid) || errdefs.Field(err) != c.field {
			t.Errorf("%s: %v, want invalid %s", c.field, err, c.field)
		}
	}
	if err := aud.AddAudit(caller, entry, ""); err != nil {
		t.Fatalf("the entry for the sealed caller: %v", err)
	}
	got, err := st.ListAudit(ctx, "", corral.AuditQuery{Action: "sandbox.delete"})
	if err != nil || len(got) != 1 {
		t.Fatalf("the audit log: %+v, %v; want one entry", got, err)
	}
	if got[0].Principal != "root" || got[0].Token != "t1" || got[0].Target != entry.Target || got[0].Result != "ok" {
		t.Errorf("the entry as written: %+v; want it the sealed caller's (root, t1)", got[0])
	}
}
