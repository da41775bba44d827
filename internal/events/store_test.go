package events_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/store"
)

// Run writes published events to the store, in order, and what is queued when it stops.
func TestRunRecordsEvents(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b := events.New("n1", events.Config{FlushEvery: 10 * time.Millisecond}, slog.New(slog.DiscardHandler))
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { b.Run(rctx, st); close(done) }()
	for i := range 700 {
		b.Publish(events.Event{Type: events.Created, Sandbox: fmt.Sprint("sb", i), Project: "/a"})
	}
	list := func() []events.Event {
		got, err := st.ListEvents(ctx, "a", time.Time{}, 10000)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(list()) < 700 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// What is queued when it stops is written too.
	for i := 700; i < 705; i++ {
		b.Publish(events.Event{Type: events.Created, Sandbox: fmt.Sprint("sb", i), Project: "/a"})
	}
	cancel()
	<-done
	got := list()
	if len(got) != 705 || got[0].Sandbox != "sb0" || got[704].Sandbox != "sb704" {
		t.Fatalf("store has %d events, want the 705 in order", len(got))
	}
	if other, _ := st.ListEvents(ctx, "b", time.Time{}, 10); len(other) != 0 {
		t.Errorf("project b sees %d of a's events", len(other))
	}
}
