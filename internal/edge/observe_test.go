package edge

import (
	"context"
	"fmt"
	"testing"
	"time"

	"errors"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/model"
)

func TestRing(t *testing.T) {
	var r ring
	for i := range 7 {
		r.add(sample{at: int64(i + 1), mem: int64(100 * (i + 1))}, 5)
	}
	var got []int64
	for _, s := range r.since(0) {
		got = append(got, s.MemoryBytes)
	}
	if fmt.Sprint(got) != "[300 400 500 600 700]" {
		t.Errorf("ring of 5 after 7 samples = %v, want the newest 5 oldest first", got)
	}
	if s := r.since(5); len(s) != 2 || s[0].MemoryBytes != 600 {
		t.Errorf("since(5) = %+v, want 600 and 700", s)
	}
	if last, ok := r.last(); !ok || last.mem != 700 {
		t.Errorf("last = %+v, %v", last, ok)
	}
	var empty ring
	if _, ok := empty.last(); ok || len(empty.since(0)) != 0 {
		t.Error("an empty ring has samples")
	}
}

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 1, 10, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		in   string
		want time.Time
		ok   bool
	}{
		{"", time.Time{}, true},
		{"10m", now.Add(-10 * time.Minute), true},
		{"7d", now.Add(-7 * 24 * time.Hour), true},
		{"2026-01-10T11:00:00Z", now.Add(-time.Hour), true},
		{"-5m", time.Time{}, false},
		{"yesterday", time.Time{}, false},
		{"99999d", time.Time{}, false},
	} {
		got, err := ParseSince("since", c.in, now)
		if (err == nil) != c.ok || (err == nil && !got.Equal(c.want)) || (err != nil && !errors.Is(err, errdefs.ErrInvalid)) {
			t.Errorf("ParseSince(%q) = %v, %v; want %v (ok %v)", c.in, got, err, c.want, c.ok)
		}
	}
}

// next reads the next event of sub, failing after a while.
func next(t *testing.T, c <-chan events.Event) events.Event {
	t.Helper()
	select {
	case ev := <-c:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
		return events.Event{}
	}
}

// A sandbox's life on the bus, in order, and in its usage row: created, started, the TTL
// extended, paused and resumed, then ended by its TTL.
func TestLifecycleEventsAndUsage(t *testing.T) {
	e, st := newTestEdge(t, newFakeRuntime())
	ctx := context.Background()
	sub, _ := e.Events().Subscribe(64, time.Time{}, nil)
	defer sub.Close()
	rec, err := e.Create(ctx, model.CreateRequest{Base: "base:1", TTL: "1s"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{events.Created, events.Started} {
		if ev := next(t, sub.C()); ev.Type != want || ev.Sandbox != rec.ID || ev.Project != "/" || ev.Tier != TierContainer || ev.Node != "local" {
			t.Fatalf("event = %+v, want %s of %s", ev, want, rec.ID)
		}
	}
	if _, err := e.SetTTL(ctx, rec.ID, "2s"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Pause(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, sub.C()); ev.Type != events.Paused || ev.Reason != "asked" {
		t.Fatalf("event = %+v, want paused", ev)
	}
	if _, err := e.Resume(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, sub.C()); ev.Type != events.Resumed {
		t.Fatalf("event = %+v, want resumed", ev)
	}
	if ev := next(t, sub.C()); ev.Type != events.TTLExpired || ev.Reason != model.ReasonTTLExpired {
		t.Fatalf("event = %+v, want ttl_expired", ev)
	}
	rows, err := st.ListUsage(ctx, "", time.Time{})
	if err != nil || len(rows) != 1 {
		t.Fatalf("usage rows = %+v, %v", rows, err)
	}
	if u := rows[0]; u.ID != rec.ID || !u.TTLExtended || u.Reason != model.ReasonTTLExpired || u.EndedAt.IsZero() || u.Tier != TierContainer {
		t.Errorf("usage = %+v", u)
	}
	// Its samples outlive it (none here: the fake runtime reports no usage); an unknown
	// sandbox's are not found.
	if m, err := e.Metrics(ctx, rec.ID, time.Time{}); err != nil || m.Samples == nil {
		t.Errorf("metrics of an ended sandbox = %+v, %v", m, err)
	}
	if _, err := e.Metrics(ctx, "sb-local-aaaaaaaaaaaaaaaa", time.Time{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("metrics of an unknown sandbox: %v, want not found", err)
	}
}

// A delete is one deleted event; a failed create is failed.
func TestDeleteAndFailedEvents(t *testing.T) {
	rt := newFakeRuntime()
	e, _ := newTestEdge(t, rt)
	ctx := context.Background()
	sub, _ := e.Events().Subscribe(64, time.Time{}, nil)
	defer sub.Close()
	rec, err := e.Create(ctx, model.CreateRequest{Base: "base:1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Delete(ctx, rec.ID); err != nil {
		t.Fatal(err)
	}
	var got []string
	for range 3 {
		got = append(got, next(t, sub.C()).Type)
	}
	if fmt.Sprint(got) != "[created started deleted]" {
		t.Errorf("events = %v", got)
	}
	rt.mu.Lock()
	rt.failing = errors.New("no room")
	rt.mu.Unlock()
	if _, err := e.Create(ctx, model.CreateRequest{Base: "base:1"}); err == nil {
		t.Fatal("create succeeded on a failing runtime")
	}
	next(t, sub.C()) // created
	if ev := next(t, sub.C()); ev.Type != events.Failed || ev.Reason == "" {
		t.Errorf("event = %+v, want failed with a reason", ev)
	}
}

// X-Corral-Tokens is validated, and summed per sandbox.
func TestObserveCallTokens(t *testing.T) {
	e, _ := newTestEdge(t, newFakeRuntime())
	rec, err := e.Create(context.Background(), model.CreateRequest{Base: "base:1"})
	if err != nil {
		t.Fatal(err)
	}
	sb := e.lookup(rec.ID)
	for _, bad := range []string{"-1", "x", "1e3", "99999999999999999999"} {
		if err := e.observeCall(sb, "POST", "/v1/sandboxes/x/exec", bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("tokens %q: %v, want invalid", bad, err)
		}
	}
	for _, n := range []string{"100", "", "23"} {
		if err := e.observeCall(sb, "GET", "/v1/sandboxes/x/files", n); err != nil {
			t.Fatal(err)
		}
	}
	if got := sb.tokens.Load(); got != 123 {
		t.Errorf("tokens = %d, want 123", got)
	}
	if sb.firstExec.Load() {
		t.Error("a file read counted as the first exec")
	}
	e.observeCall(sb, "POST", "/v1/sandboxes/x/exec", "")
	if !sb.firstExec.Load() {
		t.Error("an exec did not count as the first")
	}
}
