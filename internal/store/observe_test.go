package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/model"
)

func TestEventsConformance(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		t0 := time.Now().UTC().Truncate(time.Microsecond)
		evs := []events.Event{
			{ID: "e1", At: t0, Type: events.Created, Sandbox: "sb-1", Project: "/a"},
			{ID: "e2", At: t0.Add(time.Second), Type: events.Created, Sandbox: "sb-2", Project: "/b"},
			{ID: "e3", At: t0.Add(2 * time.Second), Type: events.Deleted, Sandbox: "sb-1", Project: "/a/x"},
			{ID: "e4", At: t0.Add(3 * time.Second), Type: events.NodeState, Node: "n1", Reason: "cordoned"},
		}
		if err := s.AddEvents(ctx, evs); err != nil {
			t.Fatal(err)
		}
		if err := s.AddEvents(ctx, evs[:1]); err != nil { // recorded twice: once
			t.Fatal(err)
		}
		ids := func(list []events.Event) (out []string) {
			for _, e := range list {
				out = append(out, e.ID)
			}
			return out
		}
		for _, c := range []struct {
			project string
			since   time.Time
			limit   int
			want    string
		}{
			{"", time.Time{}, 100, "[e1 e2 e3 e4]"},
			{"a", time.Time{}, 100, "[e1 e3]"},
			{"b", time.Time{}, 100, "[e2]"},
			{"", t0.Add(time.Second), 100, "[e2 e3 e4]"},
			{"", time.Time{}, 2, "[e1 e2]"},
		} {
			got, err := s.ListEvents(ctx, c.project, c.since, c.limit)
			if err != nil {
				t.Fatal(err)
			}
			if g := fmtList(ids(got)); g != c.want {
				t.Errorf("ListEvents(%q, %v, %d) = %s, want %s", c.project, c.since, c.limit, g, c.want)
			}
		}
		got, _ := s.ListEvents(ctx, "", time.Time{}, 1)
		if got[0].Sandbox != "sb-1" || !got[0].At.Equal(t0) || got[0].Type != events.Created {
			t.Errorf("round trip: %+v", got[0])
		}
		if err := s.PruneObservations(ctx, t0.Add(2*time.Second), t0); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.ListEvents(ctx, "", time.Time{}, 100); fmtList(ids(got)) != "[e3 e4]" {
			t.Errorf("after prune: %v", ids(got))
		}
	})
}

func fmtList(v []string) string {
	out := "["
	for i, s := range v {
		if i > 0 {
			out += " "
		}
		out += s
	}
	return out + "]"
}

func TestWebhooksConformance(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		for _, p := range []string{"a", "a/x", "b"} {
			if _, err := s.CreateProject(ctx, p, "root"); err != nil {
				t.Fatal(err)
			}
		}
		now := time.Now().UTC().Truncate(time.Microsecond)
		for i, h := range []*WebhookRecord{
			{Webhook: model.Webhook{ID: "wh-1", URL: "https://x/1", Events: []string{"created", "deleted"}, CreatedAt: now, CreatedBy: "root"}, ProjectPath: "a", SecretKey: "s1"},
			{Webhook: model.Webhook{ID: "wh-2", URL: "https://x/2", CreatedAt: now.Add(time.Second)}, ProjectPath: "a/x", SecretKey: "s2"},
			{Webhook: model.Webhook{ID: "wh-3", URL: "https://x/3", CreatedAt: now.Add(2 * time.Second)}, ProjectPath: "b", SecretKey: "s3"},
		} {
			if err := s.CreateWebhook(ctx, h); err != nil {
				t.Fatalf("webhook %d: %v", i, err)
			}
		}
		if err := s.CreateWebhook(ctx, &WebhookRecord{Webhook: model.Webhook{ID: "wh-4", URL: "https://x"}, ProjectPath: "nope"}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("webhook in a missing project: %v, want not found", err)
		}
		list, err := s.Webhooks(ctx, "a")
		if err != nil || len(list) != 2 || list[0].ID != "wh-1" || list[1].Project != "a/x" {
			t.Fatalf("Webhooks(a) = %+v, %v", list, err)
		}
		h, err := s.Webhook(ctx, "wh-1")
		if err != nil || h.SecretKey != "s1" || fmtList(h.Events) != "[created deleted]" || !h.CreatedAt.Equal(now) || h.ProjectPath != "a" {
			t.Fatalf("Webhook(wh-1) = %+v, %v", h, err)
		}
		for i := range 3 {
			d := WebhookDelivery{Webhook: "wh-1", Event: "e1", Type: "created", Attempt: i + 1, At: now.Add(time.Duration(i) * time.Second), Result: "retry"}
			if err := s.AddDelivery(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
		ds, err := s.Deliveries(ctx, "wh-1", 2)
		if err != nil || len(ds) != 2 || ds[0].Attempt != 3 || ds[1].Attempt != 2 {
			t.Errorf("Deliveries = %+v, %v, want attempts 3 and 2", ds, err)
		}
		if err := s.DeleteWebhook(ctx, "wh-1"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Webhook(ctx, "wh-1"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("deleted webhook: %v", err)
		}
		if err := s.DeleteWebhook(ctx, "wh-1"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("deleting again: %v, want not found", err)
		}
		if ds, _ := s.Deliveries(ctx, "wh-1", 10); len(ds) != 0 {
			t.Errorf("a deleted webhook's log has %d entries", len(ds))
		}
	})
}

func TestUsageConformance(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		t0 := time.Now().UTC().Truncate(time.Microsecond)
		for i, u := range []Usage{
			{ID: "sb-1", ProjectPath: "a", Node: "n1", Tier: "container", Environment: "py", CreatedAt: t0},
			{ID: "sb-2", ProjectPath: "a/x", Node: "n1", Tier: "microvm", CreatedAt: t0.Add(time.Second)},
			{ID: "sb-3", ProjectPath: "b", Node: "n2", Tier: "container", CreatedAt: t0.Add(2 * time.Second)},
		} {
			if err := s.AddUsage(ctx, u); err != nil {
				t.Fatalf("usage %d: %v", i, err)
			}
		}
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		must(s.UsageFirstExec(ctx, "sb-1", t0.Add(300*time.Millisecond)))
		must(s.UsageFirstExec(ctx, "sb-1", t0.Add(time.Hour))) // only the first counts
		must(s.UsageExtended(ctx, "sb-1"))
		must(s.UsageCounters(ctx, "sb-1", 10, 2, 5000))
		must(s.UsageEnded(ctx, "sb-1", t0.Add(time.Minute), model.ReasonTTLExpired))
		must(s.UsageEnded(ctx, "sb-1", t0.Add(time.Hour), model.ReasonDeleted)) // ended once
		list, err := s.ListUsage(ctx, "a", time.Time{})
		if err != nil || len(list) != 2 {
			t.Fatalf("ListUsage(a) = %+v, %v", list, err)
		}
		u := list[0]
		if u.ID != "sb-1" || !u.FirstExecAt.Equal(t0.Add(300*time.Millisecond)) || !u.EndedAt.Equal(t0.Add(time.Minute)) ||
			u.Reason != model.ReasonTTLExpired || !u.TTLExtended || u.Actions != 10 || u.Blocked != 2 || u.Tokens != 5000 || u.Environment != "py" {
			t.Errorf("usage of sb-1 = %+v", u)
		}
		if v := list[1]; !v.FirstExecAt.IsZero() || !v.EndedAt.IsZero() || v.TTLExtended {
			t.Errorf("usage of sb-2 = %+v, want nothing recorded", v)
		}
		if list, _ := s.ListUsage(ctx, "", t0.Add(time.Second)); len(list) != 2 {
			t.Errorf("ListUsage since t0+1s: %d rows, want 2", len(list))
		}
	})
}

// TestRecordActivity checks a node's activity batches: they touch only the node's own sandboxes,
// move a last activity forward only (overlaid on the record's document when read), keep a first
// exec once recorded, and are refused whole for a fenced incarnation.
func TestRecordActivity(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		for _, n := range []string{"n1", "n2"} {
			if _, err := s.Register(ctx, Node{Name: n, URL: "https://127.0.0.1:1"}, time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		p := mustProject(t, s, "act")
		mine, theirs := newRecord(p.ID, 0), newRecord(p.ID, 0)
		mine.Node, theirs.Node = "n1", "n2"
		for _, sb := range []*Sandbox{mine, theirs} {
			sb.CreatedAt = time.Now().Add(-time.Hour).UTC().Round(time.Microsecond) // what follows is in the past
			sb.State = model.StateRunning
			sb.LastActivityAt = sb.CreatedAt
			if err := s.PutSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
			if err := s.AddUsage(ctx, Usage{ID: sb.ID, ProjectPath: "/act", Node: sb.Node, Tier: sb.Tier, CreatedAt: sb.CreatedAt}); err != nil {
				t.Fatal(err)
			}
		}
		later, exec := mine.CreatedAt.Add(time.Minute), mine.CreatedAt.Add(time.Second)
		acts := []Activity{
			{ID: mine.ID, LastActivityAt: later, Counters: &UsageCounts{Actions: 3, Blocked: 1, Tokens: 50}, FirstExecAt: exec},
			{ID: theirs.ID, LastActivityAt: later, Counters: &UsageCounts{Actions: 99}, FirstExecAt: exec},
		}
		if err := s.RecordActivity(ctx, "n1", 1, acts); err != nil {
			t.Fatal(err)
		}
		// An older activity, a second first exec and lower counters (a batch that arrives late)
		// change nothing.
		if err := s.RecordActivity(ctx, "n1", 1, []Activity{{ID: mine.ID, LastActivityAt: exec, FirstExecAt: later,
			Counters: &UsageCounts{Actions: 1, Blocked: 0, Tokens: 10}}}); err != nil {
			t.Fatal(err)
		}
		if got, err := s.GetSandbox(ctx, mine.ID); err != nil || !got.LastActivityAt.Equal(later) {
			t.Errorf("the node's sandbox: last activity %v, %v; want %v", got.LastActivityAt, err, later)
		}
		if got, err := s.GetSandbox(ctx, theirs.ID); err != nil || !got.LastActivityAt.Equal(theirs.CreatedAt) {
			t.Errorf("another node's sandbox: last activity %v, %v; want it unchanged", got.LastActivityAt, err)
		}
		list, err := s.ListSandboxes(ctx, SandboxFilter{Node: "n1"})
		if err != nil || len(list) != 1 || !list[0].LastActivityAt.Equal(later) {
			t.Errorf("the node's sandboxes listed: %+v, %v; want the recorded activity", list, err)
		}
		usage, err := s.ListUsage(ctx, "/act", time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range usage {
			switch u.ID {
			case mine.ID:
				if u.Actions != 3 || u.Blocked != 1 || u.Tokens != 50 || !u.FirstExecAt.Equal(exec) {
					t.Errorf("the node's usage: %+v", u)
				}
			case theirs.ID:
				if u.Actions != 0 || !u.FirstExecAt.IsZero() {
					t.Errorf("another node's usage moved: %+v", u)
				}
			}
		}
		// A time ahead of the servers' clock is taken as now.
		if err := s.RecordActivity(ctx, "n1", 1, []Activity{{ID: theirs.ID}, {ID: mine.ID, LastActivityAt: time.Now().Add(100 * 365 * 24 * time.Hour)}}); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.GetSandbox(ctx, mine.ID); got.LastActivityAt.After(time.Now()) {
			t.Errorf("a last activity in the future was kept: %v", got.LastActivityAt)
		}
		// The document's own later activity (an edge's write) still wins over the column.
		mine.LastActivityAt = later.Add(time.Hour)
		if err := s.PutSandbox(ctx, mine); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.GetSandbox(ctx, mine.ID); !got.LastActivityAt.Equal(mine.LastActivityAt) {
			t.Errorf("last activity %v, want the document's later %v", got.LastActivityAt, mine.LastActivityAt)
		}
		// Usage rows the servers make from the records: asked for, or by any later entry; none
		// for a pool container; its end and TTL extension.
		fresh, pooled := newRecord(p.ID, 0), newRecord(p.ID, 0)
		fresh.Node, fresh.Environment, pooled.Node, pooled.Tier = "n1", "py", "n1", "fncall"
		fresh.CreatedAt = time.Now().Add(-time.Minute).UTC().Round(time.Microsecond)
		for _, sb := range []*Sandbox{fresh, pooled} {
			if err := s.PutSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
		}
		ended := time.Now().Add(-time.Second).UTC().Round(time.Microsecond)
		if err := s.RecordActivity(ctx, "n1", 1, []Activity{{ID: fresh.ID, Created: true}, {ID: pooled.ID, Created: true},
			{ID: fresh.ID, TTLExtended: true}, {ID: fresh.ID, EndedAt: ended, EndReason: "deleted"}}); err != nil {
			t.Fatal(err)
		}
		usage, err = s.ListUsage(ctx, "", time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		var got *Usage
		for i, u := range usage {
			switch u.ID {
			case fresh.ID:
				got = &usage[i]
			case pooled.ID:
				t.Errorf("a pool container got a usage row: %+v", u)
			}
		}
		if got == nil || got.ProjectPath != "act" || // canonical, as the report reads it got.Node != "n1" || got.Environment != "py" || !got.CreatedAt.Equal(fresh.CreatedAt) ||
			!got.EndedAt.Equal(ended) || got.Reason != "deleted" || !got.TTLExtended {
			t.Errorf("the usage row made from the record: %+v (of %+v)", got, usage)
		}
		if _, err := s.Register(ctx, Node{Name: "n1", URL: "https://127.0.0.1:1"}, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := s.RecordActivity(ctx, "n1", 1, acts[:1]); !errors.Is(err, ErrFenced) {
			t.Errorf("a fenced incarnation's activity: %v, want ErrFenced", err)
		}
	})
}
