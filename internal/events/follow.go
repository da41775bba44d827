package events

import (
	"context"
	"time"
)

// Following the store: in a cluster every edge publishes on its own bus and records its events
// in the shared store in batches, so whoever follows every node's events (GET /v1/events on a
// server, the servers' webhook dispatcher) reads them from the store.

const (
	// FollowEvery is how often a store follower reads new events.
	FollowEvery = 250 * time.Millisecond
	// FollowLag is how far back each read looks again, for events recorded late (an edge
	// writes its batches every FlushEvery, and clocks differ a little).
	FollowLag = 5 * time.Second
)

// List returns up to limit recorded events at or after since, oldest first.
type List func(ctx context.Context, since time.Time, limit int) ([]Event, error)

// Follow reads list every FollowEvery from `from` on, pages of up to page events, and calls send
// once for each event it has not seen (seen maps the IDs already sent to their times, and is
// added to; nil starts empty), until ctx ends (nil), send returns false (nil) or a read fails
// (its error). A full page is followed at once by the next, read from its newest event's time:
// more events than a page within FollowLag must not hold the follower on the same page.
func Follow(ctx context.Context, list List, page int, from time.Time, seen map[string]time.Time, send func(Event) bool) error {
	if seen == nil {
		seen = map[string]time.Time{}
	}
	t := time.NewTicker(FollowEvery)
	defer t.Stop()
	cursor := from
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for since := cursor.Add(-FollowLag); ; {
			evs, err := list(ctx, since, page)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			for _, ev := range evs {
				if _, ok := seen[ev.ID]; ok {
					continue
				}
				seen[ev.ID] = ev.At
				if !send(ev) {
					return nil
				}
				if ev.At.After(cursor) {
					cursor = ev.At
				}
			}
			if len(evs) < page || !evs[len(evs)-1].At.After(since) {
				break
			}
			since = evs[len(evs)-1].At
		}
		// Forget what no read reaches any more.
		for id, at := range seen {
			if at.Before(cursor.Add(-2 * FollowLag)) {
				delete(seen, id)
			}
		}
	}
}
