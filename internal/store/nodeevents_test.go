package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/model"
)

// TestAddNodeEvents: a node's events are recorded while its incarnation holds the node, each
// sandbox event with its record's project whatever it says (none for a sandbox the node has no
// record of), looked up in batches; a time ahead of now is taken as now.
func TestAddNodeEvents(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		defer func(n int) { eventsLookup = n }(eventsLookup)
		eventsLookup = 2 // three sandboxes: two queries
		team := mustProject(t, s, "team")
		if _, err := s.Register(ctx, Node{Name: "n1", URL: "https://127.0.0.1:1"}, time.Minute); err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC()
		var evs []events.Event
		for i, id := range []string{"sb-n1-aaaaaaaaaaaaaaaa", "sb-n1-bbbbbbbbbbbbbbbb", "sb-n1-cccccccccccccccc"} {
			if err := s.PutSandbox(ctx, &Sandbox{Sandbox: model.Sandbox{ID: id, Node: "n1", Tier: "container", State: model.StateRunning,
				CreatedAt: now, ExpiresAt: now.Add(time.Hour)}, ProjectID: team.ID}); err != nil {
				t.Fatal(err)
			}
			evs = append(evs, events.Event{ID: fmt.Sprintf("ev-n1-1-%d", i), At: now, Type: events.Created, Sandbox: id, Project: "/victim", Node: "n1"})
		}
		evs = append(evs, events.Event{ID: "ev-n1-1-9", At: now.Add(time.Hour), Type: events.Deleted, Sandbox: "sb-n1-dddddddddddddddd", Project: "/victim", Node: "n1"})
		if err := s.AddNodeEvents(ctx, "n1", 1, evs); err != nil {
			t.Fatal(err)
		}
		got, err := s.ListEvents(ctx, "", time.Time{}, 100)
		if err != nil || len(got) != 4 {
			t.Fatalf("events: %+v, %v", got, err)
		}
		for _, ev := range got {
			want := "team"
			if ev.Sandbox == "sb-n1-dddddddddddddddd" {
				want = ""
				if ev.At.After(time.Now()) {
					t.Errorf("an event dated ahead was recorded at %v", ev.At)
				}
			}
			if ev.Project != want {
				t.Errorf("event of %s recorded in project %q, want %q", ev.Sandbox, ev.Project, want)
			}
		}
		if err := s.AddNodeEvents(ctx, "n1", 0, evs[:1]); !errors.Is(err, ErrFenced) {
			t.Errorf("events of another incarnation: %v, want ErrFenced", err)
		}
	})
}
