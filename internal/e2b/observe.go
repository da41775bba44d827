package e2b

import (
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// Metrics and logs. Metrics are the node's resource samples of the sandbox (GET
// /v1/sandboxes/{id}/metrics) in E2B's shape: CPU as a share of the sandbox's CPUs, memory and
// disk against its limits. Corral's nearest thing to E2B's sandbox logs is the trajectory:
// every exec and file-changing call the sandbox received, in order; logs report those, one
// entry per step.

// metrics serves GET /sandboxes/{id}/metrics?start=&end= (unix seconds): the live sandbox's
// samples in that window, oldest first; 404 for a sandbox that ended or does not exist.
func (g *Gateway) metrics(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	q := r.URL.Query()
	if err := onlyParams(q, "start", "end"); err != nil {
		return err
	}
	start, err := intParam(q, "start", 0)
	if err != nil {
		return err
	}
	end, err := intParam(q, "end", 0)
	if err != nil {
		return err
	}
	if start < 0 || end < 0 || (end > 0 && end < start) {
		return invalid("end", "want 0 <= start <= end (unix seconds)")
	}
	sb, err := live(r.Context(), c, r.PathValue("sandboxID"))
	if err != nil {
		return err
	}
	list, err := sandboxMetrics(r, c, sb, start, end)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, list)
	return nil
}

// sandboxMetrics reads sb's samples in [start, end] (unix seconds; 0: open) as E2B metrics.
func sandboxMetrics(r *http.Request, c *corral.Client, sb *corral.Sandbox, start, end int64) ([]metric, error) {
	var since time.Time
	if start > 0 {
		since = time.Unix(start, 0).Add(-time.Nanosecond)
	}
	m, err := c.SandboxMetrics(r.Context(), sb.ID, since)
	if err != nil {
		return nil, sandboxError(r.Context(), c, sb.ID, err)
	}
	cpus := max(sb.Limits.CPUs, 0)
	out := make([]metric, 0, len(m.Samples))
	for _, s := range m.Samples {
		if end > 0 && s.At.Unix() > end {
			break
		}
		pct := s.CPUPercent
		if cpus > 0 {
			pct /= cpus // E2B's share is of all the sandbox's CPUs
		}
		out = append(out, metric{
			Timestamp: s.At, TimestampUnix: s.At.Unix(), CPUCount: int32(math.Ceil(cpus)), CPUUsedPct: pct,
			MemUsed: s.MemoryBytes, MemTotal: sb.Limits.MemoryBytes, DiskUsed: s.DiskBytes, DiskTotal: sb.Limits.DiskBytes,
		})
	}
	return out, nil
}

// maxMetricsIDs bounds the sandbox_ids of one GET /sandboxes/metrics.
const maxMetricsIDs = 100

// metricsMany serves GET /sandboxes/metrics?sandbox_ids=a,b: each named live sandbox the caller
// may see with its latest sample (unknown ones and those without a sample yet are left out, as
// E2B does).
func (g *Gateway) metricsMany(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	q := r.URL.Query()
	if err := onlyParams(q, "sandbox_ids"); err != nil {
		return err
	}
	var ids []string
	for _, v := range q["sandbox_ids"] {
		for id := range strings.SplitSeq(v, ",") {
			if id = strings.TrimSpace(id); id != "" {
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 || len(ids) > maxMetricsIDs {
		return invalid("sandbox_ids", "want 1 to %d comma-separated sandbox IDs", maxMetricsIDs)
	}
	out := map[string]metric{}
	for _, id := range ids {
		sb, err := live(r.Context(), c, id)
		if err != nil {
			continue
		}
		list, err := sandboxMetrics(r, c, sb, time.Now().Add(-time.Minute).Unix(), 0)
		if err != nil || len(list) == 0 {
			continue
		}
		out[id] = list[len(list)-1]
	}
	writeJSON(w, http.StatusOK, map[string]map[string]metric{"sandboxes": out})
	return nil
}

// onlyParams refuses query parameters other than names.
func onlyParams(q url.Values, names ...string) error {
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if !slices.Contains(names, k) {
			return invalid(k, "unknown query parameter")
		}
	}
	return nil
}

// Log levels, lowest first.
var levels = []string{"debug", "info", "warn", "error"}

// logsV2 serves GET /v2/sandboxes/{id}/logs?cursor=&limit=&direction=&level=&search=.
func (g *Gateway) logsV2(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	q := r.URL.Query()
	if err := onlyParams(q, "cursor", "limit", "direction", "level", "search"); err != nil {
		return err
	}
	cursorMs, err := intParam(q, "cursor", -1)
	if err != nil {
		return err
	}
	limit, err := intParam(q, "limit", 1000)
	if err != nil {
		return err
	}
	if limit < 0 || limit > 1000 {
		return invalid("limit", "%d: want 0 to 1000", limit)
	}
	backward := false
	switch d := q.Get("direction"); d {
	case "", "forward":
	case "backward":
		backward = true
	default:
		return invalid("direction", "%q: want forward or backward", d)
	}
	minLevel := 0
	if l := q.Get("level"); l != "" {
		if minLevel = slices.Index(levels, l); minLevel < 0 {
			return invalid("level", "%q: want debug, info, warn or error", l)
		}
	}
	search := q.Get("search")

	entries, err := g.trajectoryLogs(r, c)
	if err != nil {
		return err
	}
	if backward {
		slices.Reverse(entries)
	}
	out := []logEntry{}
	for _, e := range entries {
		ms := e.Timestamp.UnixMilli()
		if cursorMs >= 0 && (!backward && ms < cursorMs || backward && ms > cursorMs) {
			continue
		}
		if slices.Index(levels, e.Level) < minLevel || search != "" && !strings.Contains(e.Message, search) {
			continue
		}
		if len(out) == int(limit) {
			break
		}
		out = append(out, e)
	}
	writeJSON(w, http.StatusOK, map[string][]logEntry{"logs": out})
	return nil
}

// logsV1 serves the deprecated GET /sandboxes/{id}/logs?start=&limit=.
func (g *Gateway) logsV1(w http.ResponseWriter, r *http.Request, c *corral.Client) error {
	q := r.URL.Query()
	if err := onlyParams(q, "start", "limit"); err != nil {
		return err
	}
	start, err := intParam(q, "start", 0)
	if err != nil {
		return err
	}
	limit, err := intParam(q, "limit", 1000)
	if err != nil {
		return err
	}
	if limit < 0 {
		return invalid("limit", "%d: want 0 or more", limit)
	}
	entries, err := g.trajectoryLogs(r, c)
	if err != nil {
		return err
	}
	lines, full := []logLine{}, []logEntry{}
	for _, e := range entries {
		if e.Timestamp.UnixMilli() < start {
			continue
		}
		if len(full) == int(limit) {
			break
		}
		full = append(full, e)
		lines = append(lines, logLine{Timestamp: e.Timestamp, Line: e.Message})
	}
	writeJSON(w, http.StatusOK, map[string]any{"logs": lines, "logEntries": full})
	return nil
}

func intParam(q url.Values, name string, def int64) (int64, error) {
	v := q.Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, invalid(name, "%q is not an integer", v)
	}
	return n, nil
}

// trajectoryLogs returns the sandbox's trajectory as log entries, oldest first.
func (g *Gateway) trajectoryLogs(r *http.Request, c *corral.Client) ([]logEntry, error) {
	id := r.PathValue("sandboxID")
	steps, err := c.Trajectory(r.Context(), id, 0)
	if err != nil {
		return nil, sandboxError(r.Context(), c, id, err)
	}
	out := make([]logEntry, 0, len(steps))
	for _, s := range steps {
		out = append(out, stepLog(s))
	}
	slices.SortStableFunc(out, func(a, b logEntry) int { return a.Timestamp.Compare(b.Timestamp) })
	return out, nil
}

// stepLog describes one trajectory step as a log entry.
func stepLog(s corral.TrajectoryEntry) logEntry {
	req, _ := s.Request.(map[string]any)
	var msg strings.Builder
	msg.WriteString(s.Kind)
	if argv, ok := req["argv"].([]any); ok && len(argv) > 0 {
		for _, a := range argv {
			fmt.Fprintf(&msg, " %v", a)
		}
	} else if p, ok := req["path"].(string); ok {
		msg.WriteString(" " + p)
	}
	fields := map[string]string{
		"seq":   strconv.FormatInt(s.Seq, 10),
		"kind":  s.Kind,
		"state": s.State,
	}
	if s.StepID != "" {
		fields["step_id"] = s.StepID
	}
	if s.CommandID != "" {
		fields["command_id"] = s.CommandID
	}
	level := "info"
	if s.Exit != nil {
		fields["exit_code"] = strconv.Itoa(s.Exit.Code)
		fmt.Fprintf(&msg, " (exit %d)", s.Exit.Code)
		if s.Exit.Code != 0 {
			level = "warn"
		}
	}
	if s.Error != "" {
		msg.WriteString(": " + s.Error)
	}
	if s.State == corral.StepFailed || s.Error != "" {
		level = "error"
	}
	ts := s.StartedAt
	if ts.IsZero() {
		ts = time.Unix(0, 0).UTC()
	}
	return logEntry{Timestamp: ts, Level: level, Message: msg.String(), Fields: fields}
}
