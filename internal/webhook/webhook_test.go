package webhook

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"errors"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

func TestSignVerify(t *testing.T) {
	now := time.Unix(1700000000, 0)
	body := []byte(`{"type":"created"}`)
	sig := Sign("s3cret", now, body)
	if sig != "t=1700000000,v1="+mac("s3cret", "1700000000", body) {
		t.Fatalf("Sign = %q", sig)
	}
	if err := Verify("s3cret", sig, body, now.Add(time.Minute), 5*time.Minute); err != nil {
		t.Errorf("Verify of a good signature: %v", err)
	}
	for _, c := range []struct {
		name, secret, header string
		body                 []byte
		at                   time.Time
	}{
		{"wrong secret", "other", sig, body, now},
		{"changed body", "s3cret", sig, []byte(`{"type":"deleted"}`), now},
		{"too old", "s3cret", sig, body, now.Add(10 * time.Minute)},
		{"malformed", "s3cret", "v1=abc", body, now},
		{"no signature", "s3cret", "t=1700000000", body, now},
	} {
		if err := Verify(c.secret, c.header, c.body, c.at, 5*time.Minute); err == nil {
			t.Errorf("%s: Verify accepted it", c.name)
		}
	}
}

func TestValidateRequest(t *testing.T) {
	for _, c := range []struct {
		url   string
		types []string
		ok    bool
	}{
		{"https://hooks.example.com/x", nil, true},
		{"http://127.0.0.1:9/x", []string{"created", "deleted"}, true},
		{"ftp://example.com/x", nil, false},
		{"file:///etc/passwd", nil, false},
		{"example.com/x", nil, false},
		{"https://", nil, false},
		{"https://user:pw@example.com/", nil, false},
		{"https://example.com/", []string{"created", "exploded"}, false},
	} {
		err := ValidateRequest(c.url, c.types)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, errdefs.ErrInvalid)) {
			t.Errorf("ValidateRequest(%q, %q) = %v, want ok %v (or invalid)", c.url, c.types, err, c.ok)
		}
	}
}

// receiver records what it got and answers with the statuses given, one per request (the last
// one from then on); hang makes it never answer.
type receiver struct {
	mu       sync.Mutex
	statuses []int
	got      []*http.Request
	bodies   [][]byte
	hang     bool
}

func (rc *receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.got = append(rc.got, r)
	rc.bodies = append(rc.bodies, body)
	status := rc.statuses[min(len(rc.got)-1, len(rc.statuses)-1)]
	hang := rc.hang
	rc.mu.Unlock()
	if hang {
		<-r.Context().Done()
		return
	}
	w.WriteHeader(status)
}

func (rc *receiver) count() int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.got)
}

// openStore opens a fresh store with a project "a".
func openStore(t *testing.T) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.CreateProject(context.Background(), "a", "root"); err != nil {
		t.Fatal(err)
	}
	return st
}

func setup(t *testing.T, cfg Config) (*store.Store, *events.Bus, *Dispatcher) {
	t.Helper()
	st := openStore(t)
	log := slog.New(slog.DiscardHandler)
	bus := events.New("n1", events.Config{}, log)
	d := New(cfg, log, st, bus)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return st, bus, d
}

func addHook(t *testing.T, st *store.Store, d *Dispatcher, url string, events ...string) *store.WebhookRecord {
	t.Helper()
	h := &store.WebhookRecord{Webhook: model.Webhook{ID: NewID(), URL: url, Events: events, CreatedAt: time.Now()},
		ProjectPath: "a", SecretKey: NewSecret()}
	if err := st.CreateWebhook(context.Background(), h); err != nil {
		t.Fatal(err)
	}
	d.Refresh(context.Background())
	return h
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Deliveries are signed, retried on 500 with backoff until answered 2xx, and logged; events of
// other projects and of types the webhook does not ask for are not sent.
func TestDeliverRetriesOn500(t *testing.T) {
	st, bus, d := setup(t, Config{Backoff: 20 * time.Millisecond, Attempts: 5, AllowPrivate: true})
	rc := &receiver{statuses: []int{500, 503, 200}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	h := addHook(t, st, d, srv.URL+"/hook", events.Created)
	bus.Publish(events.Event{Type: events.Deleted, Sandbox: "sb-x", Project: "/a"}) // not asked for
	bus.Publish(events.Event{Type: events.Created, Sandbox: "sb-b", Project: "/b"}) // another project
	bus.Publish(events.Event{Type: events.Created, Sandbox: "sb-a", Project: "/a/sub"})
	eventually(t, "a delivery answered 200", func() bool { return d.Stats().Delivered == 1 })
	if n := rc.count(); n != 3 {
		t.Fatalf("receiver got %d requests, want 3 (500, 503, 200)", n)
	}
	rc.mu.Lock()
	for i, r := range rc.got {
		if err := Verify(h.SecretKey, r.Header.Get(SignatureHeader), rc.bodies[i], time.Now(), time.Minute); err != nil {
			t.Errorf("request %d: signature: %v", i, err)
		}
		if r.Header.Get("Corral-Event") != events.Created || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("request %d: headers %v", i, r.Header)
		}
	}
	rc.mu.Unlock()
	var log []store.WebhookDelivery
	eventually(t, "the delivery log", func() bool {
		log, _ = st.Deliveries(context.Background(), h.ID, 10)
		return len(log) == 3
	})
	if log[0].Result != "ok" || log[0].Attempt != 3 || log[1].Result != "retry" || log[1].Status != 503 || log[2].Status != 500 {
		t.Errorf("delivery log (newest first) = %+v", log)
	}
	if st := d.Stats(); st.Retried != 2 || st.Failed != 0 {
		t.Errorf("stats = %+v, want 2 retried", st)
	}
}

// A receiver that never answers is given up after the attempts, each bounded by the timeout;
// one that answers 4xx is not retried.
func TestGiveUp(t *testing.T) {
	st, bus, d := setup(t, Config{Backoff: 10 * time.Millisecond, Attempts: 3, Timeout: 100 * time.Millisecond, AllowPrivate: true})
	hang := &receiver{statuses: []int{200}, hang: true}
	hangSrv := httptest.NewServer(hang)
	defer hangSrv.Close()
	gone := &receiver{statuses: []int{410}}
	goneSrv := httptest.NewServer(gone)
	defer goneSrv.Close()
	hh := addHook(t, st, d, hangSrv.URL)
	addHook(t, st, d, goneSrv.URL)
	start := time.Now()
	bus.Publish(events.Event{Type: events.Created, Sandbox: "sb-a", Project: "/a"})
	eventually(t, "both deliveries given up", func() bool { return d.Stats().Failed == 2 })
	if hang.count() != 3 || gone.count() != 1 {
		t.Errorf("hanging receiver got %d requests (want 3), 410 one %d (want 1)", hang.count(), gone.count())
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("giving up took %v", took)
	}
	log, err := st.Deliveries(context.Background(), hh.ID, 10)
	if err != nil || len(log) != 3 || log[0].Result != "failed" || log[0].Error == "" {
		t.Errorf("delivery log of the hanging receiver = %+v, %v", log, err)
	}
}

// A full queue drops deliveries (counted) instead of waiting.
func TestQueueBounded(t *testing.T) {
	st, bus, d := setup(t, Config{Queue: 2, Workers: 1, Timeout: 5 * time.Second, Attempts: 1, AllowPrivate: true})
	hang := &receiver{statuses: []int{200}, hang: true}
	srv := httptest.NewServer(hang)
	defer srv.Close()
	addHook(t, st, d, srv.URL)
	for range 20 {
		bus.Publish(events.Event{Type: events.Created, Project: "/a"})
	}
	eventually(t, "deliveries dropped", func() bool { return d.Stats().Dropped >= 17 })
}

// Without AllowPrivate, a webhook cannot reach loopback or private addresses: the delivery
// fails at the dial, and nothing arrives.
func TestPrivateAddressesRefused(t *testing.T) {
	st, bus, d := setup(t, Config{Attempts: 1})
	rc := &receiver{statuses: []int{200}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	h := addHook(t, st, d, srv.URL)
	bus.Publish(events.Event{Type: events.Created, Project: "/a"})
	eventually(t, "the delivery refused", func() bool { return d.Stats().Failed == 1 })
	if rc.count() != 0 {
		t.Errorf("the loopback receiver got %d requests", rc.count())
	}
	log, _ := st.Deliveries(context.Background(), h.ID, 10)
	if len(log) != 1 || !strings.Contains(log[0].Error, "not a public address") {
		t.Errorf("delivery log = %+v", log)
	}
	for _, a := range []string{"127.0.0.1:80", "10.1.2.3:443", "[::1]:80", "169.254.169.254:80", "192.168.1.1:80", "100.64.0.1:80", "[::ffff:127.0.0.1]:80", "0.0.0.0:80", "[fe80::1]:80"} {
		if publicOnly(a) == nil {
			t.Errorf("publicOnly(%s) allowed it", a)
		}
	}
	for _, a := range []string{"203.0.113.9:443", "[2001:db8::1]:80", "8.8.8.8:53"} {
		if err := publicOnly(a); err != nil {
			t.Errorf("publicOnly(%s) = %v", a, err)
		}
	}
	// At creation: an address literal that cannot be delivered to is a 400; names pass (they are
	// checked at each dial), and so does everything when private targets are allowed.
	for _, u := range []string{srv.URL + "/hook", "http://localhost:8080/x", "https://[::1]/x", "http://169.254.169.254/latest"} {
		if err := d.CheckTarget(u); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("CheckTarget(%s) = %v, want invalid", u, err)
		}
	}
	for _, u := range []string{"https://hooks.example.com/x", "http://203.0.113.9/x"} {
		if err := d.CheckTarget(u); err != nil {
			t.Errorf("CheckTarget(%s) = %v", u, err)
		}
	}
	_, _, open := setup(t, Config{AllowPrivate: true})
	if err := open.CheckTarget(srv.URL); err != nil {
		t.Errorf("with AllowPrivate: CheckTarget(%s) = %v", srv.URL, err)
	}
}

// slowFirstRead holds the first read of the webhooks (Run's) until release is closed, and
// answers it with what the store held when that read began.
type slowFirstRead struct {
	*store.Store
	once           sync.Once
	begun, release chan struct{}
}

func (s *slowFirstRead) Webhooks(ctx context.Context, project string) ([]*store.WebhookRecord, error) {
	first := false
	s.once.Do(func() { first = true })
	hooks, err := s.Store.Webhooks(ctx, project)
	if first {
		close(s.begun)
		<-s.release
	}
	return hooks, err
}

// Run's first read of the webhooks, slow under load, ends after a webhook was added and
// Refresh read it: the older list must not replace the newer one (the webhook would get
// nothing until the next periodic refresh).
func TestSlowFirstReadDoesNotHideANewHook(t *testing.T) {
	st := openStore(t)
	slow := &slowFirstRead{Store: st, begun: make(chan struct{}), release: make(chan struct{})}
	bus := events.New("n1", events.Config{}, slog.New(slog.DiscardHandler))
	d := New(Config{AllowPrivate: true, Refresh: time.Hour}, slog.New(slog.DiscardHandler), slow, bus)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	<-slow.begun // Run's read has read the store, and waits
	rc := &receiver{statuses: []int{200}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	addHook(t, st, d, srv.URL)
	close(slow.release)
	bus.Publish(events.Event{Type: events.Created, Sandbox: "sb-a", Project: "/a"})
	eventually(t, "the delivery", func() bool { return d.Stats().Delivered == 1 })
}

// RunFeed (a cluster server's dispatcher) delivers what its feed sends, as given (IDs and times
// kept), and returns when the feed closes; what is still queued then is dropped, left to the
// replica that takes over.
func TestRunFeed(t *testing.T) {
	st := openStore(t)
	d := New(Config{Backoff: 20 * time.Millisecond, AllowPrivate: true}, slog.New(slog.DiscardHandler), st, nil)
	rc := &receiver{statuses: []int{200}}
	srv := httptest.NewServer(rc)
	defer srv.Close()
	addHook(t, st, d, srv.URL+"/hook", events.Created)
	feed := make(chan events.Event)
	done := make(chan struct{})
	go func() { d.RunFeed(context.Background(), feed); close(done) }()
	at := time.Now().Add(-time.Minute).UTC().Truncate(time.Millisecond)
	feed <- events.Event{ID: "ev-edge1-1", At: at, Type: events.Created, Sandbox: "sb-edge1-a", Project: "/a", Node: "edge1"}
	feed <- events.Event{ID: "ev-edge2-1", At: at, Type: events.Deleted, Sandbox: "sb-edge2-b", Project: "/a", Node: "edge2"} // not asked for
	eventually(t, "the delivery", func() bool { return d.Stats().Delivered == 1 })
	rc.mu.Lock()
	var ev events.Event
	if err := json.Unmarshal(rc.bodies[0], &ev); err != nil || ev.ID != "ev-edge1-1" || !ev.At.Equal(at) || rc.got[0].Header.Get("Corral-Delivery") != "ev-edge1-1" {
		t.Errorf("delivered %s (%v), Corral-Delivery %q; want the event as fed", rc.bodies[0], err, rc.got[0].Header.Get("Corral-Delivery"))
	}
	rc.mu.Unlock()
	close(feed)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("RunFeed did not return when its feed closed")
	}
	if n := rc.count(); n != 1 {
		t.Errorf("the receiver got %d deliveries, want 1", n)
	}
}
