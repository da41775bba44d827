// Package report computes the weekly instruments (corral report, GET /v1/report) from the
// store's usage rows: setup time (create → first exec) by tier and environment, wall-clock and
// reported tokens per task, blocked egress attempts per 1000 actions, and the shares of
// sandboxes whose TTL was extended or that their TTL ended.
package report

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/store"
)

// reasonTTLExpired is the reason the edge records for a sandbox its TTL ended (the API's
// ReasonTTLExpired; TestCompute's rows use that constant, so the two cannot drift apart).
const reasonTTLExpired = "ttl_expired"

// Report is the instruments over a period. GET /v1/report serves it as the API's Report
// (internal/apiserver converts, and adds the project).
type Report struct {
	Since, Until time.Time
	// Sandboxes created in the period.
	Sandboxes int
	// Setup is create → first exec, by tier and environment, sorted by both; never nil.
	Setup []SetupTime
	// Task is wall-clock per ended sandbox (created → ended) and the tokens reported for it.
	Task TaskTime
	// Actions counts data-plane calls; BlockedEgress blocked egress attempts.
	Actions               int64
	BlockedEgress         int64
	BlockedPer1000Actions float64
	// TTLExtended counts sandboxes whose TTL was extended, TTLKilled those ended by their TTL;
	// the shares are of Sandboxes.
	TTLExtended      int
	TTLKilled        int
	TTLExtendedShare float64
	TTLKilledShare   float64
}

// SetupTime is create → first exec of one tier and environment, in seconds.
type SetupTime struct {
	Tier, Environment      string
	Count                  int
	P50Seconds, P99Seconds float64
}

// TaskTime is the wall-clock of ended sandboxes, in seconds, and reported tokens.
type TaskTime struct {
	Count                  int
	P50Seconds, P99Seconds float64
	Tokens                 int64
	// TokensPerTask is the mean of tokens over sandboxes that reported any.
	TokensPerTask float64
}

// Compute reports on rows, the usage of the sandboxes created in [since, now].
func Compute(rows []store.Usage, since, now time.Time) Report {
	rep := Report{Since: since.UTC(), Until: now.UTC(), Setup: []SetupTime{}, Sandboxes: len(rows)}
	type key struct{ tier, env string }
	setup := map[key][]float64{}
	var task []float64
	withTokens := 0
	for _, u := range rows {
		if !u.FirstExecAt.IsZero() {
			k := key{u.Tier, u.Environment}
			setup[k] = append(setup[k], u.FirstExecAt.Sub(u.CreatedAt).Seconds())
		}
		if !u.EndedAt.IsZero() {
			task = append(task, u.EndedAt.Sub(u.CreatedAt).Seconds())
		}
		if u.Tokens > 0 {
			withTokens++
			rep.Task.Tokens += u.Tokens
		}
		rep.Actions += u.Actions
		rep.BlockedEgress += u.Blocked
		if u.TTLExtended {
			rep.TTLExtended++
		}
		if u.Reason == reasonTTLExpired {
			rep.TTLKilled++
		}
	}
	for k, v := range setup {
		rep.Setup = append(rep.Setup, SetupTime{Tier: k.tier, Environment: k.env, Count: len(v),
			P50Seconds: Percentile(v, 50), P99Seconds: Percentile(v, 99)})
	}
	slices.SortFunc(rep.Setup, func(a, b SetupTime) int {
		if c := strings.Compare(a.Tier, b.Tier); c != 0 {
			return c
		}
		return strings.Compare(a.Environment, b.Environment)
	})
	rep.Task.Count = len(task)
	rep.Task.P50Seconds, rep.Task.P99Seconds = Percentile(task, 50), Percentile(task, 99)
	if withTokens > 0 {
		rep.Task.TokensPerTask = float64(rep.Task.Tokens) / float64(withTokens)
	}
	if rep.Actions > 0 {
		rep.BlockedPer1000Actions = float64(rep.BlockedEgress) * 1000 / float64(rep.Actions)
	}
	if n := len(rows); n > 0 {
		rep.TTLExtendedShare = float64(rep.TTLExtended) / float64(n)
		rep.TTLKilledShare = float64(rep.TTLKilled) / float64(n)
	}
	return rep
}

// Percentile is the nearest-rank p-th percentile of v (0 for none); v is sorted in place.
func Percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	i := int(math.Ceil(p/100*float64(len(v)))) - 1
	return v[max(0, min(i, len(v)-1))]
}
