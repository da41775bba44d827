package events

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestFollow: every recorded event is sent once, those recorded late (before the cursor, within
// FollowLag) included, and more events within FollowLag than a page does not hold the follower
// on its first page.
func TestFollow(t *testing.T) {
	var mu sync.Mutex
	var stored []Event
	record := func(evs ...Event) {
		mu.Lock()
		defer mu.Unlock()
		stored = append(stored, evs...)
		// Oldest first, as the store answers.
		slices.SortStableFunc(stored, func(a, b Event) int { return a.At.Compare(b.At) })
	}
	list := func(ctx context.Context, since time.Time, limit int) ([]Event, error) {
		mu.Lock()
		defer mu.Unlock()
		var out []Event
		for _, ev := range stored {
			if !ev.At.Before(since) && len(out) < limit {
				out = append(out, ev)
			}
		}
		return out, nil
	}
	start := time.Now()
	var burst []Event
	for i := range 25 { // 25 events within a millisecond, pages of 4
		burst = append(burst, Event{ID: fmt.Sprintf("ev-%d", i), At: start.Add(time.Duration(i) * time.Microsecond)})
	}
	record(burst...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := map[string]int{}
	var gotMu sync.Mutex
	done := make(chan error, 1)
	go func() {
		done <- Follow(ctx, list, 4, start.Add(-time.Second), nil, func(ev Event) bool {
			gotMu.Lock()
			defer gotMu.Unlock()
			got[ev.ID]++
			return len(got) < 27
		})
	}()
	wait := func(n int) {
		t.Helper()
		for {
			gotMu.Lock()
			l := len(got)
			gotMu.Unlock()
			if l >= n {
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("the follower sent %d events, want %d: %v", l, n, got)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	wait(25)
	// One recorded late: older than the newest sent, within the lag.
	record(Event{ID: "late", At: start.Add(-time.Millisecond)}, Event{ID: "new", At: time.Now()})
	wait(27)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("%s sent %d times", id, n)
		}
	}
	if got["late"] != 1 || got["new"] != 1 {
		t.Errorf("sent %v: want the late and the new event too", got)
	}
}
