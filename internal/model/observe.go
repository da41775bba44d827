package model

import (
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

// TokensHeader is the request header a client reports the model tokens of the action it asks
// for with (a non-negative integer); Corral sums it per sandbox for the report.
const TokensHeader = "X-Corral-Tokens"
