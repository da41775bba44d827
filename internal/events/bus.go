// Package events is the in-process event bus: what happened to sandboxes and nodes (Event),
// fanned out to followers of GET /v1/events and to the webhook
// dispatcher, kept in a bounded replay buffer, and written to the store in batches.
//
// Publishing never blocks: a follower whose buffer is full is dropped (its stream ends with an
// error, and Stats counts it), and events the store writer cannot take are counted and left out
// of the durable copy (the replay buffer still has them).
//
// Concurrency: Bus.mu guards the sequence, the replay ring and the subscriber set; a
// subscriber's channel is written only with mu held and closed only by the bus, with mu held.
// The store writer is one goroutine (Run), ending with its context.
package events

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Event types: those of the event stream (GET /v1/events) and of webhooks. They are the API's
// (the SDK's EventCreated and so on; internal/apiserver's tests hold them equal).
const (
	Created       = "created"
	Started       = "started"
	Paused        = "paused"
	Resumed       = "resumed"
	Forked        = "forked"
	OOM           = "oom"
	TTLExpired    = "ttl_expired"
	IdleExpired   = "idle_expired"
	Deleted       = "deleted"
	Failed        = "failed"
	EgressBlocked = "egress_blocked"
	QuotaRefused  = "quota_refused"
	NodeState     = "node_state"
)

// Types lists every event type, in the API's order.
var Types = []string{Created, Started, Paused, Resumed, Forked, OOM,
	TTLExpired, IdleExpired, Deleted, Failed, EgressBlocked, QuotaRefused, NodeState}

// Event is something that happened to a sandbox or a node. Sandbox events name the sandbox, its
// project (display path) and node; egress_blocked is a burst of blocked attempts (Count of them,
// the first's reason); node_state names the node and its new state (Reason).
//
// Its JSON is the API's LifecycleEvent, byte for byte: the store keeps events as this JSON and
// webhooks deliver it as their payload (internal/apiserver's tests hold the two equal). The API
// and the cluster server convert to the SDK's type where they write events.
type Event struct {
	ID      string    `json:"id"`
	At      time.Time `json:"at"`
	Type    string    `json:"type"`
	Sandbox string    `json:"sandbox,omitempty"`
	Project string    `json:"project,omitempty"`
	Node    string    `json:"node,omitempty"`
	Tier    string    `json:"tier,omitempty"`
	Reason  string    `json:"reason,omitempty"`
	Count   int64     `json:"count,omitempty"`
}

// Config sizes a Bus. Zero fields take the defaults.
type Config struct {
	// Replay is how many recent events the bus keeps for followers that start with since
	// (default 4096).
	Replay int
	// StoreQueue bounds the events waiting for the store writer (default 4096).
	StoreQueue int
	// FlushEvery is how often the store writer writes a batch (default 100ms).
	FlushEvery time.Duration
}

func (c *Config) setDefaults() {
	if c.Replay <= 0 {
		c.Replay = 4096
	}
	if c.StoreQueue <= 0 {
		c.StoreQueue = 4096
	}
	if c.FlushEvery <= 0 {
		c.FlushEvery = 100 * time.Millisecond
	}
}

// Recorder keeps events durably (internal/store implements it).
type Recorder interface {
	AddEvents(ctx context.Context, evs []Event) error
}

// Bus fans events out. The zero value is not usable; call New.
type Bus struct {
	cfg    Config
	node   string
	prefix string
	log    *slog.Logger

	mu   sync.Mutex
	seq  uint64            // protected by mu
	ring []Event           // the last cfg.Replay events, oldest at next; protected by mu
	next int               // protected by mu
	full bool              // protected by mu
	subs map[*Sub]struct{} // protected by mu

	toStore chan Event

	published, droppedFollowers, storeDropped, storeFailed atomic.Uint64
}

// New returns a bus for node; IDs of its events start with node and the time it started, so
// they are unique across the node's restarts and the cluster's nodes.
func New(node string, cfg Config, log *slog.Logger) *Bus {
	cfg.setDefaults()
	return &Bus{
		cfg: cfg, node: node, log: log,
		prefix: fmt.Sprintf("ev-%s-%x-", node, time.Now().UnixNano()),
		ring:   make([]Event, cfg.Replay),
		subs:   map[*Sub]struct{}{},
		// The channel holds the queue; the writer drains it in batches.
		toStore: make(chan Event, cfg.StoreQueue),
	}
}

// Publish stamps ev (ID, At when zero, Node when empty) and hands it to every follower, the
// replay buffer and the store writer. It never blocks.
func (b *Bus) Publish(ev Event) {
	if ev.At.IsZero() {
		ev.At = time.Now().UTC()
	}
	if ev.Node == "" {
		ev.Node = b.node
	}
	b.mu.Lock()
	b.seq++
	ev.ID = fmt.Sprintf("%s%d", b.prefix, b.seq)
	b.ring[b.next] = ev
	b.next++
	if b.next == len(b.ring) {
		b.next, b.full = 0, true
	}
	for s := range b.subs {
		if !s.match(ev) {
			continue
		}
		select {
		case s.c <- ev:
		default:
			// Too slow: dropped rather than waited for.
			s.dropped.Store(true)
			close(s.c)
			delete(b.subs, s)
			b.droppedFollowers.Add(1)
		}
	}
	b.mu.Unlock()
	b.published.Add(1)
	select {
	case b.toStore <- ev:
	default:
		b.storeDropped.Add(1)
	}
}

// Sub is a subscription: events arrive on C until the bus drops it (Dropped) or Close.
type Sub struct {
	b       *Bus
	c       chan Event
	match   func(Event) bool
	dropped atomic.Bool
}

// C delivers the subscription's events; it is closed when the subscription ends.
func (s *Sub) C() <-chan Event { return s.c }

// Dropped reports whether the bus ended the subscription because its buffer was full.
func (s *Sub) Dropped() bool { return s.dropped.Load() }

// Close ends the subscription.
func (s *Sub) Close() {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	if _, ok := s.b.subs[s]; ok {
		delete(s.b.subs, s)
		close(s.c)
	}
}

// Subscribe returns a subscription to the events match accepts (nil: all), buffering up to
// buffer of them, and the replay buffer's events at or after since that match (none when since
// is zero). Events published after the call are on the subscription, those before in the
// returned slice, none in both.
func (b *Bus) Subscribe(buffer int, since time.Time, match func(Event) bool) (*Sub, []Event) {
	if match == nil {
		match = func(Event) bool { return true }
	}
	s := &Sub{b: b, c: make(chan Event, buffer), match: match}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.subs[s] = struct{}{}
	if since.IsZero() {
		return s, nil
	}
	return s, b.recentLocked(since, match)
}

// Recent returns the replay buffer's events at or after since that match (nil: all).
func (b *Bus) Recent(since time.Time, match func(Event) bool) []Event {
	if match == nil {
		match = func(Event) bool { return true }
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.recentLocked(since, match)
}

// Preconditions: b.mu is held.
func (b *Bus) recentLocked(since time.Time, match func(Event) bool) []Event {
	var out []Event
	start, n := 0, b.next
	if b.full {
		start, n = b.next, len(b.ring)
	}
	for i := range n {
		ev := b.ring[(start+i)%len(b.ring)]
		if !ev.At.Before(since) && match(ev) {
			out = append(out, ev)
		}
	}
	return out
}

// Oldest returns the time of the oldest event in the replay buffer (zero when empty).
func (b *Bus) Oldest() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.full {
		return b.ring[b.next].At
	}
	if b.next == 0 {
		return time.Time{}
	}
	return b.ring[0].At
}

// Stats are the bus's counters since it started.
type Stats struct {
	Published        uint64
	Followers        int
	DroppedFollowers uint64 // followers dropped for not reading
	StoreDropped     uint64 // events the store writer's queue had no room for
	StoreFailed      uint64 // events whose batch the store refused
}

// Stats returns the counters.
func (b *Bus) Stats() Stats {
	b.mu.Lock()
	n := len(b.subs)
	b.mu.Unlock()
	return Stats{Published: b.published.Load(), Followers: n, DroppedFollowers: b.droppedFollowers.Load(),
		StoreDropped: b.storeDropped.Load(), StoreFailed: b.storeFailed.Load()}
}

// Run writes published events to rec in batches until ctx ends, then writes what is queued.
func (b *Bus) Run(ctx context.Context, rec Recorder) {
	t := time.NewTicker(b.cfg.FlushEvery)
	defer t.Stop()
	var batch []Event
	// flush writes what is queued, in batches of at most 512.
	flush := func(ctx context.Context) {
		for {
		fill:
			for len(batch) < 512 {
				select {
				case ev := <-b.toStore:
					batch = append(batch, ev)
				default:
					break fill
				}
			}
			if len(batch) == 0 {
				return
			}
			if err := rec.AddEvents(ctx, batch); err != nil {
				b.storeFailed.Add(uint64(len(batch)))
				b.log.Warn("record events", "events", len(batch), "err", err)
			}
			batch = batch[:0]
		}
	}
	for {
		select {
		case <-ctx.Done():
			wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			flush(wctx)
			cancel()
			return
		case <-t.C:
			flush(ctx)
		}
	}
}
