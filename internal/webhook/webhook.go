// Package webhook delivers projects' events to their webhooks: each event of a project's
// subtree whose type a webhook asks for is POSTed to its URL as JSON, signed with HMAC-SHA256
// under the webhook's secret (Sign, Verify), retried with exponential backoff on a timeout, a
// connection error or a 5xx/429, and given up after a few attempts. Every attempt goes to the
// webhook's delivery log in the store.
//
// Nothing here blocks Corral: the dispatcher follows the event bus with a buffer (if it falls
// behind, the bus drops it and it subscribes again, counting the events lost), deliveries wait in
// a bounded queue (full: the delivery is dropped and counted), and a fixed set of workers does
// the HTTP, each attempt bounded by a timeout.
package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/store"
)

// SignatureHeader carries a delivery's signature (Sign); it is the API's (the SDK's
// SignatureHeader: internal/apiserver's tests hold them equal).
const SignatureHeader = "Corral-Signature"

// Sign returns the signature header's value for body sent at t under secret:
// "t=UNIX,v1=HEX", HEX = HMAC-SHA256(secret, "UNIX." + body).
func Sign(secret string, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",v1=" + mac(secret, ts, body)
}

func mac(secret, ts string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts))
	m.Write([]byte{'.'})
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// Verify checks a signature header against body and secret, refusing one older than maxAge
// (receivers use it; so do the tests).
func Verify(secret, header string, body []byte, now time.Time, maxAge time.Duration) error {
	var ts, sig string
	for part := range strings.SplitSeq(header, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "t":
			ts = v
		case "v1":
			sig = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sig == "" {
		return fmt.Errorf("malformed signature header %q", header)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > maxAge || d < -maxAge {
		return fmt.Errorf("signature time %s is more than %s away", time.Unix(sec, 0).UTC(), maxAge)
	}
	if !hmac.Equal([]byte(sig), []byte(mac(secret, ts, body))) {
		return fmt.Errorf("signature does not match")
	}
	return nil
}

// NewSecret returns a fresh webhook secret.
func NewSecret() string {
	var b [32]byte
	rand.Read(b[:])
	return "whsec_" + hex.EncodeToString(b[:])
}

// NewID returns a fresh webhook ID.
func NewID() string {
	var b [8]byte
	rand.Read(b[:])
	return "wh-" + hex.EncodeToString(b[:])
}

// ValidateRequest checks a webhook's URL (absolute http or https, at most 2048 bytes, no user
// info) and event types (known ones; none means all).
func ValidateRequest(rawURL string, types []string) error {
	if len(rawURL) > 2048 {
		return errdefs.Invalid("url", "longer than 2048 bytes")
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errdefs.Invalid("url", "%q is not an http or https URL", rawURL)
	}
	if u.User != nil {
		return errdefs.Invalid("url", "must not carry user info (the signature authenticates deliveries)")
	}
	if len(types) > len(events.Types) {
		return errdefs.Invalid("events", "at most %d types", len(events.Types))
	}
	for i, t := range types {
		if !slices.Contains(events.Types, t) {
			return errdefs.Invalid(fmt.Sprintf("events[%d]", i), "%q is not an event type (%s)", t, strings.Join(events.Types, ", "))
		}
	}
	return nil
}

// Config tunes a Dispatcher. Zero fields take the defaults.
type Config struct {
	// Attempts bounds the tries of one delivery (default 5).
	Attempts int
	// Backoff is the pause after the first failed attempt, doubling after each (default 1s).
	Backoff time.Duration
	// Timeout bounds one attempt (default 10s).
	Timeout time.Duration
	// Queue bounds the deliveries waiting for a worker or a retry (default 1024).
	Queue int
	// Workers is how many deliveries run at once (default 4).
	Workers int
	// Refresh is how often the webhooks are reread from the store (default 2s).
	Refresh time.Duration
	// AllowPrivate lets deliveries go to loopback, private, link-local and other non-public
	// addresses. Off, a webhook cannot make Corral reach its own host or network (the check is
	// on the address dialled, after DNS).
	AllowPrivate bool
	// Client sends the deliveries (default: a client with no proxy from the environment that
	// follows no redirects and dials only what AllowPrivate permits).
	Client *http.Client
}

func (c *Config) setDefaults() {
	if c.Attempts <= 0 {
		c.Attempts = 5
	}
	if c.Backoff <= 0 {
		c.Backoff = time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Queue <= 0 {
		c.Queue = 1024
	}
	if c.Workers <= 0 {
		c.Workers = 4
	}
	if c.Refresh <= 0 {
		c.Refresh = 2 * time.Second
	}
	if c.Client == nil {
		allow := c.AllowPrivate
		d := &net.Dialer{Timeout: c.Timeout, Control: func(network, address string, _ syscall.RawConn) error {
			if allow {
				return nil
			}
			return publicOnly(address)
		}}
		c.Client = &http.Client{
			Transport:     &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second, TLSHandshakeTimeout: c.Timeout},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
}

// Store is what the dispatcher needs of the store.
type Store interface {
	Webhooks(ctx context.Context, project string) ([]*store.WebhookRecord, error)
	AddDelivery(ctx context.Context, d store.WebhookDelivery) error
}

// Dispatcher delivers the bus's events to the store's webhooks.
type Dispatcher struct {
	cfg     Config
	log     *slog.Logger
	started time.Time
	st      Store
	bus     *events.Bus
	queue   chan *delivery

	// reads numbers the reads of the webhooks; hooks is the result of read number hooksRead
	// (protected by mu), so a slow read never replaces what a later one found.
	reads     atomic.Uint64
	mu        sync.Mutex
	hooks     []*store.WebhookRecord
	hooksRead uint64

	delivered, retried, failed, dropped, lost atomic.Uint64
	// waiting counts retries waiting out their backoff; at most cfg.Queue wait at once.
	waiting atomic.Int64
}

type delivery struct {
	hook    *store.WebhookRecord
	ev      events.Event
	body    []byte
	attempt int
	due     time.Time
}

// New returns a dispatcher; Run starts it.
func New(cfg Config, log *slog.Logger, st Store, bus *events.Bus) *Dispatcher {
	cfg.setDefaults()
	return &Dispatcher{cfg: cfg, log: log, st: st, bus: bus, queue: make(chan *delivery, cfg.Queue), started: time.Now()}
}

// Run delivers the bus's events until ctx ends.
func (d *Dispatcher) Run(ctx context.Context) {
	stop := d.serve(ctx)
	defer stop()
	t := time.NewTicker(d.cfg.Refresh)
	defer t.Stop()
	// Events published since New are replayed from the bus's buffer; so are those published
	// while the dispatcher was too far behind and was dropped, as far as the buffer reaches.
	since, last := d.started, ""
	for ctx.Err() == nil {
		sub, past := d.bus.Subscribe(4096, since, nil)
		for _, ev := range past {
			if ev.ID != last {
				d.enqueue(ev)
				since, last = ev.At, ev.ID
			}
		}
		since, last = d.follow(ctx, sub, t.C, since, last)
		sub.Close()
		if sub.Dropped() {
			d.lost.Add(1)
			d.log.Warn("webhook dispatcher fell behind the event bus; catching up from its replay buffer")
		}
	}
}

// RunFeed delivers the events feed sends, each once, until ctx ends or feed is closed: a cluster
// server's dispatcher, fed from the store where every edge records its events. The feeder
// rereads the webhooks (Refresh) as it reads the events they are matched with.
func (d *Dispatcher) RunFeed(ctx context.Context, feed <-chan events.Event) {
	stop := d.serve(ctx)
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-feed:
			if !ok {
				return
			}
			d.enqueue(ev)
		}
	}
}

// serve reads the webhooks and starts the workers; stop ends them (with ctx, or when called),
// waits for them and drops what is still queued: a replica that stops delivering leaves the
// events to the one that takes over (retries waiting out their backoff end with ctx too).
func (d *Dispatcher) serve(ctx context.Context) (stop func()) {
	d.refresh(ctx)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range d.cfg.Workers {
		wg.Go(func() { d.work(ctx) })
	}
	return func() {
		cancel()
		wg.Wait()
		for {
			select {
			case <-d.queue:
			default:
				return
			}
		}
	}
}

// follow enqueues the subscription's events until it ends, and returns the time and ID of the
// last one.
func (d *Dispatcher) follow(ctx context.Context, sub *events.Sub, tick <-chan time.Time, since time.Time, last string) (time.Time, string) {
	for {
		select {
		case <-ctx.Done():
			return since, last
		case <-tick:
			d.refresh(ctx)
		case ev, ok := <-sub.C():
			if !ok {
				return since, last
			}
			d.enqueue(ev)
			since, last = ev.At, ev.ID
		}
	}
}

func (d *Dispatcher) refresh(ctx context.Context) {
	n := d.reads.Add(1)
	hooks, err := d.st.Webhooks(ctx, "")
	if err != nil {
		d.log.Warn("read webhooks", "err", err)
		return
	}
	d.mu.Lock()
	// A read that began later saw every webhook this one did: Run's first read, slow under
	// load, must not undo a Refresh made after a webhook was added.
	if n > d.hooksRead {
		d.hooks, d.hooksRead = hooks, n
	}
	d.mu.Unlock()
}

// Refresh rereads the webhooks now (after one was added or removed through this process).
func (d *Dispatcher) Refresh(ctx context.Context) { d.refresh(ctx) }

func (d *Dispatcher) enqueue(ev events.Event) {
	p, err := iam.ParsePath("project", ev.Project)
	if err != nil {
		p = ""
	}
	d.mu.Lock()
	hooks := d.hooks
	d.mu.Unlock()
	var body []byte
	for _, h := range hooks {
		if !iam.Within(p, h.ProjectPath) || (len(h.Events) > 0 && !slices.Contains(h.Events, ev.Type)) {
			continue
		}
		if body == nil {
			body, _ = json.Marshal(ev)
		}
		d.push(&delivery{hook: h, ev: ev, body: body, attempt: 1, due: time.Now()})
	}
}

func (d *Dispatcher) push(dl *delivery) {
	select {
	case d.queue <- dl:
	default:
		d.dropped.Add(1)
		d.log.Warn("webhook queue full; delivery dropped", "webhook", dl.hook.ID, "event", dl.ev.ID)
	}
}

func (d *Dispatcher) work(ctx context.Context) {
	for {
		var dl *delivery
		select {
		case <-ctx.Done():
			return
		case dl = <-d.queue:
		}
		if wait := time.Until(dl.due); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		d.attempt(ctx, dl)
	}
}

// attempt sends one try of dl and logs it; a retryable failure goes back on the queue, due
// after the backoff (a goroutine holds it until then, so the workers stay free).
func (d *Dispatcher) attempt(ctx context.Context, dl *delivery) {
	start := time.Now()
	status, err := d.send(ctx, dl)
	rec := store.WebhookDelivery{Webhook: dl.hook.ID, Event: dl.ev.ID, Type: dl.ev.Type, Attempt: dl.attempt,
		At: start.UTC(), Status: status, DurationMs: float64(time.Since(start).Microseconds()) / 1000}
	retry := false
	if err == nil && status >= 200 && status < 300 {
		rec.Result = "ok"
	} else {
		if err != nil {
			rec.Error = err.Error()
		} else {
			rec.Error = fmt.Sprintf("receiver answered %d", status)
		}
		retry = (err != nil || status >= 500 || status == http.StatusTooManyRequests) && dl.attempt < d.cfg.Attempts
		rec.Result = "failed"
		if retry {
			rec.Result = "retry"
		}
	}
	// Logged before counted: whoever sees the count finds the attempt in the log.
	if werr := d.st.AddDelivery(context.WithoutCancel(ctx), rec); werr != nil {
		d.log.Warn("record webhook delivery", "err", werr)
	}
	switch rec.Result {
	case "ok":
		d.delivered.Add(1)
	case "retry":
		d.retried.Add(1)
	default:
		d.failed.Add(1)
	}
	if !retry {
		return
	}
	next := *dl
	next.attempt++
	wait := d.cfg.Backoff << (dl.attempt - 1)
	next.due = time.Now().Add(wait)
	if d.waiting.Add(1) > int64(d.cfg.Queue) {
		d.waiting.Add(-1)
		d.dropped.Add(1)
		return
	}
	go func() {
		defer d.waiting.Add(-1)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
			d.push(&next)
		}
	}()
}

// TestType is the type of the event Test sends.
const TestType = "test"

// Test delivers one event of type TestType to hook now, whatever events it subscribes to: one
// attempt, signed and logged like any delivery and never retried, so whoever set the webhook up
// sees at once whether its receiver answers and checks the signature. It returns the attempt.
func (d *Dispatcher) Test(ctx context.Context, hook *store.WebhookRecord, by string) store.WebhookDelivery {
	var b [6]byte
	rand.Read(b[:])
	ev := events.Event{ID: "test-" + hex.EncodeToString(b[:]), At: time.Now().UTC(), Type: TestType,
		Project: hook.Project, Reason: "a test delivery asked for by " + by}
	body, _ := json.Marshal(ev)
	dl := &delivery{hook: hook, ev: ev, body: body, attempt: 1, due: time.Now()}
	start := time.Now()
	status, err := d.send(ctx, dl)
	rec := store.WebhookDelivery{Webhook: hook.ID, Event: ev.ID, Type: ev.Type, Attempt: 1, At: start.UTC(), Status: status,
		DurationMs: float64(time.Since(start).Microseconds()) / 1000, Result: "ok"}
	switch {
	case err != nil:
		rec.Result, rec.Error = "failed", err.Error()
	case status < 200 || status >= 300:
		rec.Result, rec.Error = "failed", fmt.Sprintf("receiver answered %d", status)
	}
	if werr := d.st.AddDelivery(context.WithoutCancel(ctx), rec); werr != nil {
		d.log.Warn("record webhook delivery", "err", werr)
	}
	return rec
}

func (d *Dispatcher) send(ctx context.Context, dl *delivery) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, dl.hook.URL, bytes.NewReader(dl.body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "corral-webhook")
	req.Header.Set("Corral-Event", dl.ev.Type)
	req.Header.Set("Corral-Delivery", dl.ev.ID)
	req.Header.Set("Corral-Webhook", dl.hook.ID)
	req.Header.Set(SignatureHeader, Sign(dl.hook.SecretKey, time.Now(), dl.body))
	resp, err := d.cfg.Client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, nil
}

// Stats are the dispatcher's counters since it started.
type Stats struct {
	Delivered, Retried, Failed, Dropped, Lost uint64
}

// Stats returns the counters: deliveries that succeeded, attempts retried, deliveries given up,
// deliveries dropped on a full queue, and times the dispatcher fell behind the bus (and caught
// up from its replay buffer, losing what had left it).
func (d *Dispatcher) Stats() Stats {
	return Stats{Delivered: d.delivered.Load(), Retried: d.retried.Load(), Failed: d.failed.Load(),
		Dropped: d.dropped.Load(), Lost: d.lost.Load()}
}

// CheckTarget refuses, when the dispatcher delivers to public addresses only, a URL whose host is
// an address literal (or "localhost") that is not public: a clear 400 at creation rather than
// deliveries that can only fail. Names are checked where they resolve, at each dial.
func (d *Dispatcher) CheckTarget(rawURL string) error {
	if d.cfg.AllowPrivate {
		return nil
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return errdefs.Invalid("url", "%q is not an http or https URL", rawURL)
	}
	host := u.Hostname()
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		host = "127.0.0.1"
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return nil
	}
	if err := publicOnly(net.JoinHostPort(host, "0")); err != nil {
		return errdefs.Invalid("url", "%v", err)
	}
	return nil
}

// publicOnly refuses a dial to an address that is not a public unicast one.
func publicOnly(address string) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return err
	}
	ip = ip.Unmap()
	if ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsMulticast() ||
		ip.IsUnspecified() || ip.IsInterfaceLocalMulticast() || cgnat.Contains(ip) {
		return fmt.Errorf("%s is not a public address (corral up --webhook-allow-private allows it)", ip)
	}
	return nil
}

// cgnat is the shared address space of carrier-grade NAT (RFC 6598), not public either.
var cgnat = netip.MustParsePrefix("100.64.0.0/10")
