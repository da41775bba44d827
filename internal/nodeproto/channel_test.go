package nodeproto

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/store"
)

// replica is a stand-in replica's node channel answering with h, counting its calls.
func replica(t *testing.T, h http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var calls atomic.Int32
	hs := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if err := CheckVersion(r.Header); err != nil {
			t.Errorf("a call without the protocol's version: %v", err)
		}
		h(w, r)
	}))
	t.Cleanup(hs.Close)
	return hs, &calls
}

func answer(state string, servers ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(HeartbeatResponse{State: state, Servers: servers})
	}
}

// insecure trusts any certificate: the stand-ins' are httptest's (the real checks are
// clusterauth's, tested there and in internal/cluster).
var insecure = &tls.Config{InsecureSkipVerify: true}

func TestServersFailOver(t *testing.T) {
	ctx := context.Background()
	dead, _ := replica(t, answer("ready"))
	dead.Close()
	busy, busyCalls := replica(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		json.NewEncoder(w).Encode(map[string]string{"code": "unavailable", "message": "the store is unreachable"})
	})
	live, liveCalls := replica(t, answer("draining", "https://10.0.0.7:7071"))
	s, err := NewServers([]string{dead.URL, busy.URL + "/", live.URL, live.URL}, insecure)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.URLs(); !slices.Equal(got, []string{dead.URL, busy.URL, live.URL}) {
		t.Fatalf("URLs %q: want each once, without the slash", got)
	}
	hb, err := s.Heartbeat(ctx, 3, 15*time.Second, nil)
	if err != nil || hb.State != "draining" {
		t.Fatalf("heartbeat with one replica dead and one unavailable: %+v, %v", hb, err)
	}
	if busyCalls.Load() != 1 || liveCalls.Load() != 1 {
		t.Errorf("calls: unavailable %d, live %d; want one each", busyCalls.Load(), liveCalls.Load())
	}
	// The replica that answered comes first, then those it named; the others are dropped.
	if got := s.URLs(); !slices.Equal(got, []string{live.URL, "https://10.0.0.7:7071"}) {
		t.Errorf("URLs after the heartbeat: %q", got)
	}
	if _, err := s.Heartbeat(ctx, 3, 15*time.Second, nil); err != nil || liveCalls.Load() != 2 {
		t.Errorf("the next heartbeat: %v, live calls %d (want it called first)", err, liveCalls.Load())
	}
}

func TestServersRefusals(t *testing.T) {
	ctx := context.Background()
	fenced, _ := replica(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(HeaderRefusal, string(StaleEpoch))
		w.WriteHeader(http.StatusServiceUnavailable) // as httpjson answers store.ErrFenced
		json.NewEncoder(w).Encode(map[string]string{"code": "stale_epoch", "message": "node n1 epoch 2: fenced"})
	})
	other, otherCalls := replica(t, answer("ready"))
	s, err := NewServers([]string{fenced.URL, other.URL}, insecure)
	if err != nil {
		t.Fatal(err)
	}
	// A refusal is the answer: no other replica is asked.
	if _, err := s.Heartbeat(ctx, 2, 15*time.Second, nil); !errors.Is(err, store.ErrFenced) {
		t.Errorf("a stale epoch's heartbeat: %v, want store.ErrFenced", err)
	}
	if otherCalls.Load() != 0 {
		t.Errorf("a refusal was tried on another replica")
	}
	denied, _ := replica(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		json.NewEncoder(w).Encode(map[string]string{"code": "denied", "message": "sandbox sb-n2-x is not node n1's"})
	})
	s, _ = NewServers([]string{denied.URL}, insecure)
	if err := s.EventRecorder(1).AddEvents(ctx, []events.Event{{ID: "ev-n1-1"}}); !errors.Is(err, errdefs.ErrDenied) {
		t.Errorf("refused events: %v, want ErrDenied", err)
	}
	// Every replica unreachable: unavailable, naming each.
	gone, _ := replica(t, answer("ready"))
	gone.Close()
	s, _ = NewServers([]string{gone.URL}, insecure)
	if _, err := s.Heartbeat(ctx, 1, 15*time.Second, nil); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("no replica reachable: %v, want unavailable", err)
	}
	if _, err := NewServers([]string{"http://10.0.0.1:7071"}, insecure); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a plain-HTTP node channel: %v", err)
	}
	if _, err := NewServers(nil, insecure); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("no node channel: %v", err)
	}
}

func TestEventBatches(t *testing.T) {
	var sizes []int
	hs, _ := replica(t, func(w http.ResponseWriter, r *http.Request) {
		var req EventsRequest
		json.NewDecoder(r.Body).Decode(&req)
		sizes = append(sizes, len(req.Events))
		if req.Epoch != 7 {
			t.Errorf("epoch %d, want 7", req.Epoch)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	s, _ := NewServers([]string{hs.URL}, insecure)
	evs := make([]events.Event, MaxEvents+5)
	if err := s.EventRecorder(7).AddEvents(context.Background(), evs); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sizes, []int{MaxEvents, 5}) {
		t.Errorf("batches %v, want %d then 5", sizes, MaxEvents)
	}
}

func TestLeaseTTL(t *testing.T) {
	for ms, ok := range map[int64]bool{2999: false, 3000: true, 15000: true, 300000: true, 300001: false, -1: false} {
		if _, err := LeaseTTL(ms); (err == nil) != ok {
			t.Errorf("LeaseTTL(%d): %v", ms, err)
		}
	}
}

// TestServersOlderReplica: a replica that does not serve a path (one of an older release, during
// a rolling upgrade) answers a router's 404, and the call goes to the next replica; an API
// error's 404 is the answer.
func TestServersOlderReplica(t *testing.T) {
	ctx := context.Background()
	older, olderCalls := replica(t, http.NotFound)
	live, liveCalls := replica(t, answer("ready"))
	s, err := NewServers([]string{older.URL, live.URL}, insecure)
	if err != nil {
		t.Fatal(err)
	}
	if hb, err := s.Heartbeat(ctx, 1, 15*time.Second, nil); err != nil || hb.State != "ready" {
		t.Fatalf("heartbeat with an older replica first: %+v, %v", hb, err)
	}
	if olderCalls.Load() != 1 || liveCalls.Load() != 1 {
		t.Errorf("calls: older %d, live %d; want one each", olderCalls.Load(), liveCalls.Load())
	}
	missing, _ := replica(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(map[string]string{"code": "not_found", "message": "layer x:1"})
	})
	s, _ = NewServers([]string{missing.URL, live.URL}, insecure)
	if _, err := s.Publisher().DeleteLayer(ctx, "x", "1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("an API error's 404: %v, want not found", err)
	}
}
