package events

import (
	"fmt"
	"log/slog"
	"testing"
	"time"
)

func newBus(t *testing.T, cfg Config) *Bus {
	t.Helper()
	return New("n1", cfg, slog.New(slog.DiscardHandler))
}

func TestPublishOrderAndFilter(t *testing.T) {
	b := newBus(t, Config{})
	sub, past := b.Subscribe(16, time.Time{}, func(ev Event) bool { return ev.Project == "a" })
	defer sub.Close()
	if past != nil {
		t.Fatalf("no since: past = %v, want none", past)
	}
	for i, p := range []string{"a", "b", "a", "a"} {
		b.Publish(Event{Type: Created, Sandbox: fmt.Sprint("sb", i), Project: p})
	}
	var got []string
	for range 3 {
		ev := <-sub.C()
		if ev.Node != "n1" || ev.ID == "" || ev.At.IsZero() {
			t.Errorf("event not stamped: %+v", ev)
		}
		got = append(got, ev.Sandbox)
	}
	if fmt.Sprint(got) != "[sb0 sb2 sb3]" {
		t.Errorf("subscriber got %v, want [sb0 sb2 sb3] in order", got)
	}
	select {
	case ev := <-sub.C():
		t.Errorf("unexpected event %+v", ev)
	default:
	}
}

func TestReplayBuffer(t *testing.T) {
	b := newBus(t, Config{Replay: 4})
	t0 := time.Now().UTC()
	for i := range 6 {
		b.Publish(Event{At: t0.Add(time.Duration(i) * time.Second), Type: Created, Sandbox: fmt.Sprint("sb", i)})
	}
	var got []string
	for _, ev := range b.Recent(t0.Add(3*time.Second), nil) {
		got = append(got, ev.Sandbox)
	}
	if fmt.Sprint(got) != "[sb3 sb4 sb5]" {
		t.Errorf("Recent = %v, want [sb3 sb4 sb5]", got)
	}
	got = nil
	for _, ev := range b.Recent(t0, nil) {
		got = append(got, ev.Sandbox)
	}
	if fmt.Sprint(got) != "[sb2 sb3 sb4 sb5]" {
		t.Errorf("Recent of a wrapped ring = %v, want the newest 4", got)
	}
	if !b.Oldest().Equal(t0.Add(2 * time.Second)) {
		t.Errorf("Oldest = %v, want %v", b.Oldest(), t0.Add(2*time.Second))
	}
	sub, past := b.Subscribe(4, t0.Add(5*time.Second), nil)
	defer sub.Close()
	if len(past) != 1 || past[0].Sandbox != "sb5" {
		t.Errorf("Subscribe since: past = %v, want sb5", past)
	}
}

// A follower that never reads is dropped, with its channel closed and a count; publishing
// never waits for it.
func TestSlowFollowerDropped(t *testing.T) {
	b := newBus(t, Config{StoreQueue: 8})
	slow, _ := b.Subscribe(2, time.Time{}, nil)
	fast, _ := b.Subscribe(100, time.Time{}, nil)
	defer fast.Close()
	done := make(chan struct{})
	go func() {
		for range 50 {
			b.Publish(Event{Type: Started})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Publish blocked on a follower that does not read")
	}
	n := 0
	for range slow.C() {
		n++
	}
	if !slow.Dropped() || n != 2 {
		t.Errorf("slow follower: dropped %v after %d events, want dropped after 2", slow.Dropped(), n)
	}
	if len(fast.C()) != 50 {
		t.Errorf("fast follower has %d events, want 50", len(fast.C()))
	}
	st := b.Stats()
	if st.DroppedFollowers != 1 || st.Followers != 1 || st.Published != 50 {
		t.Errorf("stats = %+v, want 1 dropped, 1 follower, 50 published", st)
	}
	// Nobody writes to the store here: all but the queue's 8 are counted as left out.
	if st.StoreDropped != 42 {
		t.Errorf("StoreDropped = %d, want 42", st.StoreDropped)
	}
	slow.Close() // closing a dropped subscription is harmless
}
