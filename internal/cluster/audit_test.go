package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/nodeproto"
)

// TestNodeAudit: an edge's audit entries are written by the servers as the caller they sealed
// for the edge (its principal and token, whatever the entry says), only with such a caller, and
// within bounds; the edge's queue sends them, the last ones as it stops.
func TestNodeAudit(t *testing.T) {
	ctx := context.Background()
	st, srv, edge1 := registeredEdge(t, ctx)
	caller := sealedFor(t, ctx, "edge1", map[string]iam.Perm{"": iam.SandboxAdmin}, srv.sealer)
	voucher := nodeproto.VoucherFrom(caller)
	entry := model.AuditEntry{At: time.Now().UTC(), Principal: "someone-else", Token: "tok-forged", Project: "", Action: "sandbox.delete", Target: "sb-edge1-aaaaaaaaaaaaaaaa", Result: "ok"}

	// What the servers refuse, entry by entry, and what they write.
	items := []nodeproto.AuditItem{
		{Entry: entry}, // no caller
		{Entry: entry, Voucher: nodeproto.VoucherFrom(sealedFor(t, ctx, "edge2", map[string]iam.Perm{"": iam.SandboxAdmin}, srv.sealer))},
	}
	for _, edit := range []func(e *model.AuditEntry){
		func(e *model.AuditEntry) { e.Action = "" },
		func(e *model.AuditEntry) { e.Result = strings.Repeat("x", 33) },
		func(e *model.AuditEntry) { e.At = time.Now().Add(-2 * time.Hour) },
		func(e *model.AuditEntry) { e.At = time.Now().Add(time.Hour) },
	} {
		e := entry
		edit(&e)
		items = append(items, nodeproto.AuditItem{Entry: e, Voucher: voucher})
	}
	items = append(items, nodeproto.AuditItem{Entry: entry, Voucher: voucher})
	// Free text over its bounds is cut at a character's start, not refused.
	long := entry
	long.Action, long.Target, long.Detail = "sandbox.ttl", strings.Repeat("é", 200), strings.Repeat("é", 600)
	items = append(items, nodeproto.AuditItem{Entry: long, Voucher: voucher})
	ans, err := srv.nodeAudit(ctx, "edge1", &nodeproto.AuditRequest{Entries: items})
	if err != nil || ans.Refused != len(items)-2 {
		t.Fatalf("a batch of %d entries, two good: %+v, %v; want %d refused", len(items), ans, err, len(items)-2)
	}
	if got, err := st.ListAudit(ctx, "", model.AuditQuery{Action: "sandbox.ttl"}); err != nil || len(got) != 1 ||
		len(got[0].Target) != 256 || len(got[0].Detail) != 1024 || !utf8.ValidString(got[0].Target+got[0].Detail) {
		t.Errorf("long free text: %d entries, %v; want it cut to 256 and 1024 bytes of whole characters", len(got), err)
	}
	if _, err := srv.nodeAudit(ctx, "edge1", &nodeproto.AuditRequest{Entries: make([]nodeproto.AuditItem, nodeproto.MaxAuditBatch+1)}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a batch over %d entries: %v, want invalid", nodeproto.MaxAuditBatch, err)
	}
	got, err := st.ListAudit(ctx, "", model.AuditQuery{Action: "sandbox.delete"})
	if err != nil || len(got) != 1 {
		t.Fatalf("the audit log: %+v, %v; want one entry", got, err)
	}
	if got[0].Principal != "root" || got[0].Token != "t1" || got[0].Target != entry.Target || got[0].Result != "ok" {
		t.Errorf("the entry as written: %+v; want it the sealed caller's (root, t1)", got[0])
	}

	// An entry names a project its caller holds something in, or goes to the caller's token's.
	for _, p := range []string{"a", "b"} {
		if _, err := st.CreateProject(ctx, p, "root"); err != nil {
			t.Fatal(err)
		}
	}
	h := http.Header{}
	alice := &nodeproto.Caller{TokenID: "t2", Principal: "alice", ProjectPath: "a", Perms: iam.SandboxAdmin, Held: map[string]iam.Perm{"a": iam.SandboxAdmin}, CreatedAt: time.Now()}
	if err := nodeproto.SetSealedCaller(h, alice, "edge1", srv.sealer, nodeproto.RequestVoucherTTL); err != nil {
		t.Fatal(err)
	}
	inA, inB := entry, entry
	inA.Action, inA.Project = "sandbox.power", "a"
	inB.Action, inB.Project = "sandbox.power", "b"
	if _, err := srv.nodeAudit(ctx, "edge1", &nodeproto.AuditRequest{Entries: []nodeproto.AuditItem{{Entry: inA, Voucher: nodeproto.VoucherOf(h)}, {Entry: inB, Voucher: nodeproto.VoucherOf(h)}}}); err != nil {
		t.Fatal(err)
	}
	if got, err := st.ListAudit(ctx, "b", model.AuditQuery{Action: "sandbox.power"}); err != nil || len(got) != 0 {
		t.Errorf("b's audit log after an entry of a caller who holds nothing there: %+v, %v; want none", got, err)
	}
	if got, err := st.ListAudit(ctx, "a", model.AuditQuery{Action: "sandbox.power"}); err != nil || len(got) != 2 || got[0].Principal != "alice" {
		t.Errorf("a's audit log: %+v, %v; want both of alice's entries", got, err)
	}

	// The edge's queue sends its entries off the requests' path, and what is queued when it
	// stops.
	q := edge1.AuditQueue(slog.New(slog.NewTextHandler(io.Discard, nil)))
	qctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); q.Run(qctx) }()
	for i := range 3 {
		e := entry
		e.Action, e.Target = "sandbox.pause", fmt.Sprintf("sb-edge1-%016d", i)
		if err := q.AddAudit(caller, e, ""); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := st.ListAudit(ctx, "", model.AuditQuery{Action: "sandbox.pause"})
		if err == nil && len(got) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queued entries in the audit log: %d, %v; want 3", len(got), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	e := entry
	e.Action = "sandbox.resume"
	if err := q.AddAudit(caller, e, ""); err != nil {
		t.Fatal(err)
	}
	stop()
	<-done
	if got, err := st.ListAudit(ctx, "", model.AuditQuery{Action: "sandbox.resume"}); err != nil || len(got) != 1 {
		t.Errorf("an entry queued as the edge stopped: %d, %v; want it written", len(got), err)
	}
}
