package nodeproto

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
)

// AuditRequest records the audit entries of requests an edge served (PathAudit), each for its
// Voucher, the request's caller as the servers sealed it for the node: the servers write an
// entry with that caller's principal and token, whatever the entry says, and its token's
// project as the fallback (store.AddAudit). An entry they refuse (no caller, one sealed for
// another node or expired, a field out of bounds) is left out and counted in the answer.
type AuditRequest struct {
	Entries []AuditItem `json:"entries"`
}

// AuditItem is one entry of an AuditRequest.
type AuditItem struct {
	Entry   model.AuditEntry `json:"entry"`
	Voucher *Voucher         `json:"voucher,omitempty"`
}

// AuditResponse says how many entries of an AuditRequest were left out.
type AuditResponse struct {
	Refused int `json:"refused,omitempty"`
}

// Bounds of the audit queue.
const (
	// MaxAuditBatch bounds the entries of one AuditRequest, and maxAuditBatchBytes their size
	// (a caller's voucher, sealed with every entry, may be large).
	MaxAuditBatch      = 64
	maxAuditBatchBytes = 4 << 20
	// maxAuditQueue and maxAuditQueueBytes bound the entries waiting for the servers (an
	// outage of every replica): past them an entry is refused (and logged), and the request it
	// is of answers as it would have.
	maxAuditQueue      = 10000
	maxAuditQueueBytes = 64 << 20
	// auditFlushWait bounds the last flush when the edge stops.
	auditFlushWait = 5 * time.Second
)

// AuditQueue sends an edge's audit entries to the servers (apiserver.Auditor), off the
// requests' path: AddAudit queues the entry with the caller ctx carries (WithVoucher), and Run
// sends what is queued in batches of MaxAuditBatch, keeping them through an outage of the
// replicas (retried with backoff, at most maxAuditQueue entries). An entry is written by the
// servers within a round trip of its request's end, or lost with the edge if it dies first;
// the servers refuse an entry over an hour old or whose caller's seal has expired, so an
// outage longer than that loses what was queued during it (logged by both sides).
type AuditQueue struct {
	s    *Servers
	log  *slog.Logger
	wake chan struct{}

	mu      sync.Mutex
	queue   []AuditItem
	bytes   int // the queue's size (auditSize)
	dropped int // entries refused since the last warning, the queue being full
}

// auditSize is about what it takes to hold and send it.
func auditSize(it AuditItem) int {
	e := it.Entry
	n := 256 + len(e.Principal) + len(e.Token) + len(e.Project) + len(e.Action) + len(e.Target) + len(e.Result) + len(e.Detail)
	if it.Voucher != nil {
		n += len(it.Voucher.Caller) + len(it.Voucher.Seal)
	}
	return n
}

// AuditQueue returns the queue of an edge's audit entries; run it with Run.
func (s *Servers) AuditQueue(log *slog.Logger) *AuditQueue {
	return &AuditQueue{s: s, log: log, wake: make(chan struct{}, 1)}
}

// AddAudit queues e for the servers; fallback is theirs to know (the sealed caller's token's
// project).
func (q *AuditQueue) AddAudit(ctx context.Context, e model.AuditEntry, _ string) error {
	it := AuditItem{Entry: e, Voucher: VoucherFrom(ctx)}
	size := auditSize(it)
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.queue) >= maxAuditQueue || q.bytes+size > maxAuditQueueBytes {
		q.dropped++
		return fmt.Errorf("audit entry %s left out: %d entries (%d bytes) wait for the servers: %w", e.Action, len(q.queue), q.bytes, errdefs.ErrUnavailable)
	}
	q.queue = append(q.queue, it)
	q.bytes += size
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return nil
}

// Run sends the queued entries until ctx ends, then what is left, for auditFlushWait at most.
// After a failure it waits (100 ms, doubling to 5 s) before it tries again, whatever is queued
// meanwhile.
func (q *AuditQueue) Run(ctx context.Context) {
	var retry, backoff time.Duration // retry 0: wait for an entry
	for {
		var wake <-chan struct{}
		var later <-chan time.Time
		if retry == 0 {
			wake = q.wake
		} else {
			later = time.After(retry)
		}
		select {
		case <-ctx.Done():
			q.flush()
			return
		case <-wake:
		case <-later:
		}
		retry = 0
		for q.pending() > 0 {
			if err := q.send(ctx); err != nil {
				backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
				retry = backoff
				q.log.Warn("send audit entries to the servers; retrying", "entries", q.pending(), "retry_in", retry, "err", err)
				break
			}
			backoff = 0
		}
	}
}

// flush sends what is queued when the edge stops, for auditFlushWait at most.
func (q *AuditQueue) flush() {
	ctx, cancel := context.WithTimeout(context.Background(), auditFlushWait)
	defer cancel()
	for q.pending() > 0 && q.send(ctx) == nil {
	}
	if n := q.pending(); n > 0 {
		q.log.Error("audit entries lost: the servers did not take them before the edge stopped", "entries", n)
	}
}

func (q *AuditQueue) pending() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}

// send sends the first batch of the queue and takes it off when the servers answered. A batch
// they refuse whole (an edge of a newer release, say) is dropped and logged: sending it again
// would be refused again.
func (q *AuditQueue) send(ctx context.Context) error {
	q.mu.Lock()
	n, size := 0, 0
	for n < len(q.queue) && n < MaxAuditBatch && (n == 0 || size+auditSize(q.queue[n]) <= maxAuditBatchBytes) {
		size += auditSize(q.queue[n])
		n++
	}
	batch := q.queue[:n]
	dropped := q.dropped
	q.dropped = 0
	q.mu.Unlock()
	if dropped > 0 {
		q.log.Error("audit entries lost: the queue for the servers was full", "entries", dropped)
	}
	if len(batch) == 0 {
		return nil
	}
	var ans AuditResponse
	err := q.s.call(ctx, PathAudit, AuditRequest{Entries: batch}, &ans)
	if err != nil && (errors.Is(err, errdefs.ErrUnavailable) || ctx.Err() != nil) {
		return err // kept: the batch is sent again
	}
	q.mu.Lock()
	q.bytes -= size
	if q.queue = q.queue[len(batch):]; len(q.queue) == 0 {
		q.queue, q.bytes = nil, 0 // the sent entries' array goes
	}
	q.mu.Unlock()
	switch {
	case err != nil:
		q.log.Error("audit entries lost: the servers refused them", "entries", len(batch), "err", err)
	case ans.Refused > 0:
		q.log.Error("audit entries lost: the servers refused some", "entries", ans.Refused, "of", len(batch))
	}
	return nil
}
