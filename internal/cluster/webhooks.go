package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/webhook"
)

// Webhook delivery in a cluster: every edge records its events in the store, and one server
// replica at a time (the holder of the store's "webhooks" lock) follows them there and delivers
// them, so an event is sent once however many replicas run, and from a server, never from a
// sandbox host (which holds no webhook secret). When the holder dies or loses the database,
// another replica takes the lock over and goes on from the holder's last saved position, a
// little before it: an event near a takeover can be delivered twice (receivers tell deliveries
// apart by the event's ID). Deliveries the holder had queued or was retrying when it died are
// not sent again, as with corral up's own dispatcher.

const (
	// webhookLock names the lock the delivering replica holds.
	webhookLock = "webhooks"
	// webhookCursor is the setting that keeps how far delivery got.
	webhookCursor = "webhooks.cursor"
	// cursorEvery is how often the delivering replica saves how far it got.
	cursorEvery = 2 * time.Second
	// cursorReach bounds how far back a replica taking over goes: events older than this are
	// not delivered after an outage of every replica (the store keeps them for GET /v1/events).
	cursorReach = time.Hour
)

// dispatchWebhooks delivers the cluster's events to the webhooks while this replica holds the
// webhook lock, and waits for the lock otherwise, until ctx ends.
func (s *Server) dispatchWebhooks(ctx context.Context, hooks *webhook.Dispatcher) {
	for ctx.Err() == nil {
		lock, err := s.store.Lock(ctx, webhookLock)
		if err != nil {
			return // ctx ended
		}
		from := s.webhookStart(ctx)
		s.log.Info("this replica delivers the webhooks", "from", from)
		dctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-lock.Lost():
				s.log.Warn("lost the webhook lock (the store connection broke); delivery stops until this replica takes it again")
				cancel()
			case <-dctx.Done():
			}
		}()
		s.followForWebhooks(dctx, hooks, from)
		cancel()
		lock.Release()
		if ctx.Err() == nil {
			select { // a broken store: let it come back
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// followForWebhooks feeds hooks the store's events from `from` on until ctx ends or a read
// fails, saving how far it got every cursorEvery.
func (s *Server) followForWebhooks(ctx context.Context, hooks *webhook.Dispatcher, from time.Time) {
	feed := make(chan events.Event, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		hooks.RunFeed(ctx, feed)
	}()
	cursor, saved := from, from
	save := func(ctx context.Context) {
		if cursor.Equal(saved) {
			return
		}
		doc, _ := json.Marshal(struct {
			At time.Time `json:"at"`
		}{cursor})
		if err := s.store.PutSetting(ctx, webhookCursor, doc); err != nil {
			s.log.Warn("save how far webhook delivery got", "err", err)
			return
		}
		saved = cursor
	}
	last := time.Now()
	list := func(ctx context.Context, since time.Time, limit int) ([]events.Event, error) {
		// Every FollowEvery: the time to save the position, in step with the reads.
		if time.Since(last) >= cursorEvery {
			save(ctx)
			last = time.Now()
		}
		evs, err := s.store.ListEvents(ctx, "", since, limit)
		if err == nil && len(evs) > 0 {
			// The webhooks are reread after the events they are matched with (and only when
			// there are some): a webhook added through any replica before an event was
			// recorded is in the list that event meets.
			hooks.Refresh(ctx)
		}
		return evs, err
	}
	err := events.Follow(ctx, list, 4096, from, nil, func(ev events.Event) bool {
		select {
		case feed <- ev:
		case <-ctx.Done():
			return false
		}
		if ev.At.After(cursor) {
			cursor = ev.At
		}
		return true
	})
	close(feed)
	<-done
	if err != nil {
		s.log.Warn("follow the events for webhooks", "err", err)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	save(sctx)
	cancel()
}

// webhookStart returns where delivery goes on from: the last saved position (events.Follow reads
// a little before it, for events recorded late), within cursorReach; now on a cluster's first
// start.
func (s *Server) webhookStart(ctx context.Context) time.Time {
	now := time.Now()
	doc, err := s.store.GetSetting(ctx, webhookCursor)
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) {
			s.log.Warn("read how far webhook delivery got; starting from now", "err", err)
		}
		return now
	}
	var c struct {
		At time.Time `json:"at"`
	}
	if json.Unmarshal(doc, &c) != nil || c.At.IsZero() {
		return now
	}
	if reach := now.Add(-cursorReach); c.At.Before(reach) {
		s.log.Warn("webhook delivery stopped longer ago than it goes back; older events are not delivered", "stopped", c.At, "from", reach)
		return reach
	}
	return c.At
}
