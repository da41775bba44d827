package nodeproto

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/model"
)

// TestAuditQueue: the queue sends its entries in batches of at most MaxAuditBatch, in order,
// keeps them through replicas that are unavailable, and drops a batch a replica refuses.
func TestAuditQueue(t *testing.T) {
	var mu sync.Mutex
	var got []string
	var sizes []int
	unavailable := 2
	hs, calls := replica(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if unavailable > 0 {
			unavailable--
			w.WriteHeader(http.StatusServiceUnavailable)
			json.NewEncoder(w).Encode(map[string]string{"code": "unavailable", "message": "the store is unreachable"})
			return
		}
		var req AuditRequest
		json.NewDecoder(r.Body).Decode(&req)
		if req.Entries[0].Entry.Action == "refused" {
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(map[string]string{"code": "invalid", "message": "entries: a batch is of 1 to 64"})
			return
		}
		sizes = append(sizes, len(req.Entries))
		for _, it := range req.Entries {
			got = append(got, it.Entry.Target)
		}
		json.NewEncoder(w).Encode(AuditResponse{})
	})
	s, _ := NewServers([]string{hs.URL}, insecure)
	q := s.AuditQueue(slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	for i := range MaxAuditBatch + 6 {
		if err := q.AddAudit(ctx, model.AuditEntry{Action: "sandbox.create", Target: fmt.Sprint(i)}, ""); err != nil {
			t.Fatal(err)
		}
	}
	go func() { defer close(done); q.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for q.pending() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	q.AddAudit(ctx, model.AuditEntry{Action: "refused"}, "")
	for q.pending() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(got) != MaxAuditBatch+6 || got[0] != "0" || got[len(got)-1] != fmt.Sprint(MaxAuditBatch+5) {
		t.Errorf("entries received: %d (%v ... %v), want %d in order", len(got), got[:min(len(got), 1)], got[max(len(got)-1, 0):], MaxAuditBatch+6)
	}
	if len(sizes) != 2 || sizes[0] != MaxAuditBatch || sizes[1] != 6 {
		t.Errorf("batches %v, want %d then 6", sizes, MaxAuditBatch)
	}
	if q.pending() != 0 || calls.Load() != 5 {
		t.Errorf("after the refused batch: %d pending, %d calls; want it dropped after 2 unavailable, 2 batches and 1 refusal", q.pending(), calls.Load())
	}
}
