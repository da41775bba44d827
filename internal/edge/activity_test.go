package edge

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/store"
)

// fakeActivity records the batches an edge sends, failing while fail is set.
type fakeActivity struct {
	mu      sync.Mutex
	fail    bool
	batches [][]store.Activity
}

func (f *fakeActivity) RecordActivity(ctx context.Context, acts []store.Activity) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return errors.New("the servers are unreachable")
	}
	f.batches = append(f.batches, slices.Clone(acts))
	return nil
}

// TestSendActivity: with an activity recorder (a cluster's servers), live sandboxes' activity
// goes in one batch of what changed since the last; a failed batch's changes go with the next.
func TestSendActivity(t *testing.T) {
	rec := &fakeActivity{}
	e := &Edge{cfg: Config{Activity: rec}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), live: map[string]*sandbox{}}
	used, quiet, pool := &sandbox{id: "sb-n1-used"}, &sandbox{id: "sb-n1-quiet"}, &sandbox{id: "sb-n1-pool", fncall: "fn"}
	for _, sb := range []*sandbox{used, quiet, pool} {
		e.live[sb.id] = sb
	}
	now := time.Now().UnixNano()
	used.lastActivity.Store(now)
	used.actions.Add(3)
	used.tokens.Add(40)
	pool.lastActivity.Store(now)
	pool.actions.Add(7) // a pool container keeps no usage row: no counters sent

	ctx := context.Background()
	e.flushActivity(ctx)
	if len(rec.batches) != 1 || len(rec.batches[0]) != 2 {
		t.Fatalf("batches %+v, want one of the two sandboxes that did something", rec.batches)
	}
	for _, a := range rec.batches[0] {
		switch a.ID {
		case used.id:
			if a.Counters == nil || a.Counters.Actions != 3 || a.Counters.Tokens != 40 || a.LastActivityAt.UnixNano() != now {
				t.Errorf("the used sandbox's activity: %+v", a)
			}
		case pool.id:
			if a.Counters != nil || a.LastActivityAt.UnixNano() != now {
				t.Errorf("the pool container's activity: %+v", a)
			}
		default:
			t.Errorf("a sandbox that did nothing was sent: %+v", a)
		}
	}
	// Nothing new: nothing sent.
	e.flushActivity(ctx)
	if len(rec.batches) != 1 {
		t.Fatalf("a batch without changes was sent: %+v", rec.batches[1:])
	}
	// A batch that fails goes again with the next.
	quiet.lastActivity.Store(now + 1)
	rec.fail = true
	e.flushActivity(ctx)
	rec.fail = false
	quiet.tokens.Add(5)
	e.flushActivity(ctx)
	if len(rec.batches) != 2 || len(rec.batches[1]) != 1 {
		t.Fatalf("batches after a failure %+v", rec.batches)
	}
	if a := rec.batches[1][0]; a.ID != quiet.id || a.LastActivityAt.UnixNano() != now+1 || a.Counters == nil || a.Counters.Tokens != 5 {
		t.Errorf("the batch after a failure: %+v", a)
	}
}

// TestActivityQueue: what happens once in a sandbox's life is queued and sent in one batch off
// the request's path; a failed batch is sent again, before what was queued since; what is left
// at the end goes with the last periodic batch.
func TestActivityQueue(t *testing.T) {
	rec := &fakeActivity{fail: true}
	e := &Edge{cfg: Config{Activity: rec}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), live: map[string]*sandbox{},
		stop: make(chan struct{}), activity: newActivityQueue()}
	go e.activityLoop()
	e.queueActivity(store.Activity{ID: "sb-n1-a", Created: true})
	e.queueActivity(store.Activity{ID: "sb-n1-a", FirstExecAt: time.Now()})
	batches := func() [][]store.Activity {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return slices.Clone(rec.batches)
	}
	time.Sleep(3 * activityBatchWait) // the first try fails: nothing recorded
	rec.mu.Lock()
	rec.fail = false
	rec.mu.Unlock()
	e.queueActivity(store.Activity{ID: "sb-n1-b", EndedAt: time.Now(), EndReason: "deleted"})
	deadline := time.Now().Add(10 * time.Second)
	for len(batches()) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	got := batches()
	if len(got) != 1 || len(got[0]) != 3 || got[0][0].ID != "sb-n1-a" || !got[0][0].Created || got[0][2].ID != "sb-n1-b" {
		t.Fatalf("batches %+v, want the failed entries then the new one, in one batch", got)
	}
	close(e.stop)
	<-e.activity.done
	// Left at the end: sent with the last flush (Close's).
	e.queueActivity(store.Activity{ID: "sb-n1-c", TTLExtended: true})
	e.flushActivity(context.Background())
	if got := batches(); len(got) != 2 || len(got[1]) != 1 || !got[1][0].TTLExtended {
		t.Errorf("the last flush: %+v", got)
	}
}
