package corral

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// MetricSample is one resource sample of a sandbox, taken by its node every few seconds
// (`corral up --sample-interval`). CPUPercent is of one CPU (200 is two CPUs busy); the byte
// counts of the network are totals since the sandbox's network was made.
type MetricSample struct {
	At              time.Time `json:"at"`
	CPUPercent      float64   `json:"cpu_percent"`
	MemoryBytes     int64     `json:"memory_bytes"`
	MemoryPeakBytes int64     `json:"memory_peak_bytes"`
	DiskBytes       int64     `json:"disk_bytes"`
	NetRxBytes      int64     `json:"net_rx_bytes"`
	NetTxBytes      int64     `json:"net_tx_bytes"`
	Pids            int64     `json:"pids"`
}

// Metrics is the answer of GET /v1/sandboxes/{id}/metrics: samples oldest first, and the
// sampling interval in seconds.
type Metrics struct {
	Samples         []MetricSample `json:"samples"`
	IntervalSeconds float64        `json:"interval_seconds,omitempty"`
}

// SandboxMetrics returns the resource samples the sandbox's node keeps of it (its life, and a
// while after it ended), those after since when it is not zero.
func (c *Client) SandboxMetrics(ctx context.Context, id string, since time.Time) (*Metrics, error) {
	q := url.Values{}
	if !since.IsZero() {
		q.Set("since", since.UTC().Format(time.RFC3339Nano))
	}
	var out Metrics
	return &out, c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "metrics"), query: q}, &out)
}

// Event types of the event stream (GET /v1/events) and of webhooks.
const (
	EventCreated       = "created"
	EventStarted       = "started"
	EventPaused        = "paused"
	EventResumed       = "resumed"
	EventForked        = "forked"
	EventOOM           = "oom"
	EventTTLExpired    = "ttl_expired"
	EventIdleExpired   = "idle_expired"
	EventDeleted       = "deleted"
	EventFailed        = "failed"
	EventEgressBlocked = "egress_blocked"
	EventQuotaRefused  = "quota_refused"
	EventNodeState     = "node_state"
)

// EventTypes lists every event type, for validation and help.
var EventTypes = []string{EventCreated, EventStarted, EventPaused, EventResumed, EventForked, EventOOM,
	EventTTLExpired, EventIdleExpired, EventDeleted, EventFailed, EventEgressBlocked, EventQuotaRefused, EventNodeState}

// LifecycleEvent is one line of the event stream: something that happened to a sandbox or a
// node. Sandbox events name the sandbox, its project and node; egress_blocked is a burst of
// blocked attempts (Count of them, the first's reason); node_state names the node and its new
// state (Reason).
type LifecycleEvent struct {
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

// EventQuery selects events: those of Project's subtree (default: the token's project), after
// Since (default: none from the past when following, the last hour otherwise), of Types (default
// all); Follow keeps the stream open for new ones.
type EventQuery struct {
	Project string
	Since   time.Time
	Types   []string
	Follow  bool
}

// Events opens the event stream. Read it with [EventStream.Next]; Close it when done.
func (c *Client) Events(ctx context.Context, q EventQuery) (*EventStream, error) {
	v := url.Values{}
	if q.Project != "" {
		v.Set("project", q.Project)
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if len(q.Types) > 0 {
		v.Set("type", strings.Join(q.Types, ","))
	}
	if q.Follow {
		v.Set("follow", "true")
	}
	resp, err := c.send(ctx, request{method: http.MethodGet, path: "/v1/events", query: v})
	if err != nil {
		return nil, err
	}
	return &EventStream{body: resp.Body, dec: json.NewDecoder(resp.Body)}, nil
}

// EventStream is an open event stream. It is not safe for concurrent use, except that Close may
// be called from any goroutine to end a blocked Next.
type EventStream struct {
	body      io.ReadCloser
	dec       *json.Decoder
	err       error
	closed    atomic.Bool
	closeOnce sync.Once
}

// eventLine is a line of the stream: an event, or an error that ended it.
type eventLine struct {
	LifecycleEvent
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// Next returns the next event; io.EOF once a stream without Follow ended; an *[APIError] when
// the server ended it (a follower too slow to keep up is dropped: CodeExhausted).
func (s *EventStream) Next() (LifecycleEvent, error) {
	if s.err != nil {
		return LifecycleEvent{}, s.err
	}
	var line eventLine
	if err := s.dec.Decode(&line); err != nil {
		switch {
		case s.closed.Load():
			s.err = ErrStreamClosed
		case errors.Is(err, io.EOF):
			s.err = io.EOF
		default:
			s.err = fmt.Errorf("read event stream: %w", err)
		}
		return LifecycleEvent{}, s.err
	}
	if line.Code != "" {
		s.err = &APIError{Status: http.StatusOK, Code: line.Code, Message: line.Message}
		return LifecycleEvent{}, s.err
	}
	return line.LifecycleEvent, nil
}

// Close ends the stream.
func (s *EventStream) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.body.Close()
	})
	return nil
}

// Webhook sends a project's events (those of its subtree) to a URL, signed. Secret is set only
// in the answer of its creation.
type Webhook struct {
	ID        string    `json:"id"`
	Project   string    `json:"project"`
	URL       string    `json:"url"`
	Events    []string  `json:"events"`
	Secret    string    `json:"secret,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by,omitempty"`
}

// WebhookRequest creates a webhook: Events empty means every type.
type WebhookRequest struct {
	Project string   `json:"project,omitempty"`
	URL     string   `json:"url"`
	Events  []string `json:"events,omitempty"`
}

// WebhookDelivery is one attempt to deliver an event to a webhook. Result is "ok", "retry"
// (another attempt follows) or "failed" (given up), with Error saying why.
type WebhookDelivery struct {
	Webhook    string    `json:"webhook"`
	Event      string    `json:"event"`
	Type       string    `json:"type"`
	Attempt    int       `json:"attempt"`
	At         time.Time `json:"at"`
	Status     int       `json:"status,omitempty"`
	Result     string    `json:"result"`
	Error      string    `json:"error,omitempty"`
	DurationMs float64   `json:"duration_ms"`
}

// SignatureHeader carries a webhook delivery's signature: "t=UNIX,v1=HEX", HEX being
// HMAC-SHA256 under the webhook's secret of "UNIX." followed by the body.
const SignatureHeader = "Corral-Signature"

// CreateWebhook adds a webhook; the answer carries its secret, shown this once.
func (c *Client) CreateWebhook(ctx context.Context, req WebhookRequest) (*Webhook, error) {
	var out Webhook
	return &out, c.do(ctx, request{method: http.MethodPost, path: "/v1/webhooks", json: req}, &out)
}

// Webhooks lists the webhooks of project's subtree (default: the token's project).
func (c *Client) Webhooks(ctx context.Context, project string) ([]Webhook, error) {
	v := url.Values{}
	if project != "" {
		v.Set("project", project)
	}
	var out []Webhook
	return out, c.do(ctx, request{method: http.MethodGet, path: "/v1/webhooks", query: v}, &out)
}

// DeleteWebhook removes a webhook; deliveries in flight are dropped.
func (c *Client) DeleteWebhook(ctx context.Context, id string) error {
	return c.do(ctx, request{method: http.MethodDelete, path: "/v1/webhooks/" + url.PathEscape(id)}, nil)
}

// TestWebhook sends the webhook one event of type "test" now, whatever events it subscribes to,
// and returns the attempt (logged with its deliveries, never retried).
func (c *Client) TestWebhook(ctx context.Context, id string) (*WebhookDelivery, error) {
	var out WebhookDelivery
	return &out, c.do(ctx, request{method: http.MethodPost, path: "/v1/webhooks/" + url.PathEscape(id) + "/test"}, &out)
}

// WebhookDeliveries returns a webhook's most recent delivery attempts, newest first.
func (c *Client) WebhookDeliveries(ctx context.Context, id string) ([]WebhookDelivery, error) {
	var out []WebhookDelivery
	return out, c.do(ctx, request{method: http.MethodGet, path: "/v1/webhooks/" + url.PathEscape(id) + "/deliveries"}, &out)
}

// Report is the weekly instruments over a period (GET /v1/report).
type Report struct {
	Project string    `json:"project"`
	Since   time.Time `json:"since"`
	Until   time.Time `json:"until"`
	// Sandboxes created in the period (fncall pool containers are left out).
	Sandboxes int `json:"sandboxes"`
	// Setup is create → first exec, by tier and environment ("" when layers were named).
	Setup []SetupTime `json:"setup"`
	// Task is wall-clock per sandbox (ended ones: created → ended) and the tokens clients
	// reported for it (X-Corral-Tokens).
	Task TaskTime `json:"task"`
	// Actions counts data-plane calls; BlockedEgress blocked egress attempts.
	Actions               int64   `json:"actions"`
	BlockedEgress         int64   `json:"blocked_egress"`
	BlockedPer1000Actions float64 `json:"blocked_per_1000_actions"`
	// TTLExtended counts sandboxes whose TTL was extended (they outlived their first one),
	// TTLKilled those ended by their TTL; the shares are of Sandboxes.
	TTLExtended      int     `json:"ttl_extended"`
	TTLKilled        int     `json:"ttl_killed"`
	TTLExtendedShare float64 `json:"ttl_extended_share"`
	TTLKilledShare   float64 `json:"ttl_killed_share"`
}

// SetupTime is create → first exec of one tier and environment, in seconds.
type SetupTime struct {
	Tier        string  `json:"tier"`
	Environment string  `json:"environment"`
	Count       int     `json:"count"`
	P50Seconds  float64 `json:"p50_seconds"`
	P99Seconds  float64 `json:"p99_seconds"`
}

// TaskTime is the wall-clock of ended sandboxes, in seconds, and reported tokens.
type TaskTime struct {
	Count      int     `json:"count"`
	P50Seconds float64 `json:"p50_seconds"`
	P99Seconds float64 `json:"p99_seconds"`
	Tokens     int64   `json:"tokens"`
	// TokensPerTask is the mean of tokens over sandboxes that reported any.
	TokensPerTask float64 `json:"tokens_per_task"`
}

// ReportQuery selects a report's period and project (defaults: the last 7 days, the token's
// project).
type ReportQuery struct {
	Project string
	Since   time.Duration
}

// Report returns the weekly instruments.
func (c *Client) Report(ctx context.Context, q ReportQuery) (*Report, error) {
	v := url.Values{}
	if q.Project != "" {
		v.Set("project", q.Project)
	}
	if q.Since > 0 {
		v.Set("since", q.Since.String())
	}
	var out Report
	return &out, c.do(ctx, request{method: http.MethodGet, path: "/v1/report", query: v}, &out)
}

// TokensHeader is the request header a client reports the model tokens of the action it asks
// for with (a non-negative integer); Corral sums it per sandbox for the report.
const TokensHeader = "X-Corral-Tokens"

// PrometheusMetrics returns GET /v1/metrics, the server's Prometheus text (operator).
func (c *Client) PrometheusMetrics(ctx context.Context) (string, error) {
	resp, err := c.send(ctx, request{method: http.MethodGet, path: "/v1/metrics"})
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	return string(b), err
}
