package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
)

// The observability tables (issue 28): the durable copy of the event stream, webhooks and
// their delivery log, and a usage row per sandbox that outlives the sandbox's record (the
// report reads it).

// AddEvents records events in one transaction. An event's project is its display path ("" or
// "/" for the root).
func (s *Store) AddEvents(ctx context.Context, evs []events.Event) error {
	if len(evs) == 0 {
		return nil
	}
	err := s.tx(ctx, func(tx *Tx) error { return insertEvents(ctx, tx, evs) })
	if err != nil {
		return fmt.Errorf("record %d events: %w", len(evs), err)
	}
	return nil
}

// AddNodeEvents records evs of incarnation epoch of node, in one transaction with the check that
// epoch is still the node's and the node not lost (ErrFenced otherwise): what an incarnation the
// cluster fenced off says happened is not recorded. The node's row is read, not locked. A
// sandbox event's project is its record's, whatever the event says (none when the node has no
// such sandbox), so an edge's events reach only its own sandboxes' projects; a time ahead of now
// is taken as now.
func (s *Store) AddNodeEvents(ctx context.Context, node string, epoch int64, evs []events.Event) error {
	err := s.tx(ctx, func(tx *Tx) error {
		if err := readEpoch(ctx, tx, node, epoch); err != nil {
			return err
		}
		projects, err := nodeSandboxProjects(ctx, tx, node, evs)
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		for i := range evs {
			if evs[i].Sandbox != "" {
				evs[i].Project = projects[evs[i].Sandbox]
			}
			if evs[i].At.After(now) {
				evs[i].At = now
			}
		}
		return insertEvents(ctx, tx, evs)
	})
	if err != nil {
		return fmt.Errorf("record %d events of node %s: %w", len(evs), node, err)
	}
	return nil
}

// eventsLookup bounds the sandboxes one query of nodeSandboxProjects names.
var eventsLookup = 500

// nodeSandboxProjects returns the project path (iam.Display) of every sandbox of node's that evs
// name, a query per eventsLookup of them; a sandbox node has no record of is left out.
func nodeSandboxProjects(ctx context.Context, tx *Tx, node string, evs []events.Event) (map[string]string, error) {
	var ids []string
	seen := map[string]bool{}
	for _, ev := range evs {
		if ev.Sandbox != "" && !seen[ev.Sandbox] {
			seen[ev.Sandbox] = true
			ids = append(ids, ev.Sandbox)
		}
	}
	projects := make(map[string]string, len(ids))
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), eventsLookup)]
		ids = ids[len(chunk):]
		args := []any{node}
		for _, id := range chunk {
			args = append(args, id)
		}
		rows, err := tx.QueryContext(ctx, `SELECT s.id, COALESCE(p.path, '') FROM sandboxes s LEFT JOIN projects p ON p.id = s.project_id
			WHERE s.node = ? AND s.id IN (?`+strings.Repeat(", ?", len(chunk)-1)+`)`, args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var id, path string
			if err := rows.Scan(&id, &path); err != nil {
				rows.Close()
				return nil, err
			}
			projects[id] = iam.Display(path) // the root's canonical path is ""
		}
		if err := rows.Close(); err != nil {
			return nil, err
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return projects, nil
}

// insertEvents adds evs to the events table; one already there (a batch sent again) is kept.
func insertEvents(ctx context.Context, tx *Tx, evs []events.Event) error {
	for _, ev := range evs {
		p, err := iam.ParsePath("project", ev.Project)
		if err != nil {
			p = ""
		}
		doc, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO events (id, at, type, project_path, doc) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (id) DO NOTHING`, ev.ID, ev.At.UnixNano(), ev.Type, p, string(doc)); err != nil {
			return err
		}
	}
	return nil
}

// ListEvents returns up to limit events of the canonical project's subtree at or after since,
// oldest first.
func (s *Store) ListEvents(ctx context.Context, project string, since time.Time, limit int) ([]events.Event, error) {
	cond, args := subtreeCond("project_path", project)
	args = append([]any{since.UnixNano()}, args...)
	args = append(args, limit)
	rows, err := s.rdb.QueryContext(ctx, `SELECT doc FROM events WHERE at >= ? AND `+cond+` ORDER BY at, id LIMIT ?`, args...)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	defer rows.Close()
	var out []events.Event
	for rows.Next() {
		var doc string
		if err := rows.Scan(&doc); err != nil {
			return nil, fmt.Errorf("list events: %w", err)
		}
		var ev events.Event
		if err := json.Unmarshal([]byte(doc), &ev); err != nil {
			return nil, fmt.Errorf("list events: decode: %w", err)
		}
		out = append(out, ev)
	}
	return out, rows.Err()
}

// PruneObservations removes events and webhook deliveries older than before, and usage rows of
// sandboxes created before usageBefore.
func (s *Store) PruneObservations(ctx context.Context, before, usageBefore time.Time) error {
	for _, q := range []struct {
		sql string
		at  time.Time
	}{
		{`DELETE FROM events WHERE at < ?`, before},
		{`DELETE FROM webhook_deliveries WHERE at < ?`, before},
		{`DELETE FROM sandbox_usage WHERE created_at < ?`, usageBefore},
	} {
		if _, err := s.db.ExecContext(ctx, q.sql, q.at.UnixNano()); err != nil {
			return fmt.Errorf("prune observations: %w", err)
		}
	}
	return nil
}

// WebhookRecord is a webhook with what delivery needs: its secret and its project's canonical path.
type WebhookRecord struct {
	model.Webhook
	ProjectPath string
	SecretKey   string
}

// CreateWebhook records w in the project at its (canonical) ProjectPath, which must exist.
func (s *Store) CreateWebhook(ctx context.Context, w *WebhookRecord) error {
	err := s.tx(ctx, func(tx *Tx) error {
		proj, err := getProject(ctx, tx, w.ProjectPath)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO webhooks (id, project_id, url, events, secret, created_at, created_by) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			w.ID, proj.ID, w.URL, strings.Join(w.Events, ","), w.SecretKey, w.CreatedAt.UnixNano(), w.CreatedBy)
		return err
	})
	if err != nil {
		return fmt.Errorf("create webhook: %w", err)
	}
	return nil
}

const webhookCols = `w.id, p.path, w.url, w.events, w.secret, w.created_at, w.created_by FROM webhooks w JOIN projects p ON p.id = w.project_id`

func scanWebhook(sc interface{ Scan(...any) error }) (*WebhookRecord, error) {
	var w WebhookRecord
	var events string
	var created int64
	if err := sc.Scan(&w.ID, &w.ProjectPath, &w.URL, &events, &w.SecretKey, &created, &w.CreatedBy); err != nil {
		return nil, err
	}
	w.Project = iam.Display(w.ProjectPath)
	if events != "" {
		w.Events = strings.Split(events, ",")
	}
	w.CreatedAt = time.Unix(0, created).UTC()
	return &w, nil
}

// Webhooks returns the webhooks of the canonical project's subtree, oldest first.
func (s *Store) Webhooks(ctx context.Context, project string) ([]*WebhookRecord, error) {
	cond, args := subtreeCond("p.path", project)
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+webhookCols+` WHERE `+cond+` ORDER BY w.created_at, w.id`, args...)
	if err != nil {
		return nil, fmt.Errorf("list webhooks: %w", err)
	}
	defer rows.Close()
	var out []*WebhookRecord
	for rows.Next() {
		w, err := scanWebhook(rows)
		if err != nil {
			return nil, fmt.Errorf("list webhooks: %w", err)
		}
		out = append(out, w)
	}
	return out, rows.Err()
}

// Webhook returns one webhook, or an ErrNotFound error.
func (s *Store) Webhook(ctx context.Context, id string) (*WebhookRecord, error) {
	w, err := scanWebhook(s.rdb.QueryRowContext(ctx, `SELECT `+webhookCols+` WHERE w.id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.NotFound("webhook %s", id)
	}
	if err != nil {
		return nil, fmt.Errorf("get webhook %s: %w", id, err)
	}
	return w, nil
}

// DeleteWebhook removes a webhook and its delivery log.
func (s *Store) DeleteWebhook(ctx context.Context, id string) error {
	err := s.tx(ctx, func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM webhooks WHERE id = ?`, id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return errdefs.NotFound("webhook %s", id)
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE webhook_id = ?`, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("delete webhook %s: %w", id, err)
	}
	return nil
}

// WebhookDelivery is one attempt to deliver an event to a webhook. Result is "ok", "retry"
// (another attempt follows) or "failed" (given up), with Error saying why. The log keeps its
// JSON, which is the API's corral.WebhookDelivery byte for byte (internal/apiserver converts
// where it answers, and its tests hold the two equal).
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

// AddDelivery appends one delivery attempt to its webhook's log.
func (s *Store) AddDelivery(ctx context.Context, d WebhookDelivery) error {
	doc, err := json.Marshal(d)
	if err != nil {
		return err
	}
	if _, err := s.db.ExecContext(ctx, `INSERT INTO webhook_deliveries (webhook_id, at, doc) VALUES (?, ?, ?)`,
		d.Webhook, d.At.UnixNano(), string(doc)); err != nil {
		return fmt.Errorf("record webhook delivery: %w", err)
	}
	return nil
}

// Deliveries returns up to limit of a webhook's delivery attempts, newest first.
func (s *Store) Deliveries(ctx context.Context, webhook string, limit int) ([]WebhookDelivery, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT doc FROM webhook_deliveries WHERE webhook_id = ? ORDER BY id DESC LIMIT ?`, webhook, limit)
	if err != nil {
		return nil, fmt.Errorf("list webhook deliveries: %w", err)
	}
	defer rows.Close()
	out := []WebhookDelivery{}
	for rows.Next() {
		var doc string
		if err := rows.Scan(&doc); err != nil {
			return nil, fmt.Errorf("list webhook deliveries: %w", err)
		}
		var d WebhookDelivery
		if err := json.Unmarshal([]byte(doc), &d); err != nil {
			return nil, fmt.Errorf("list webhook deliveries: decode: %w", err)
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// Usage is a sandbox's row for the report: when it was made and first used, how it ended, and
// its counters (flushed while it runs, final when it ends).
type Usage struct {
	ID          string
	ProjectPath string // canonical
	Node        string
	Tier        string
	Environment string
	CreatedAt   time.Time
	FirstExecAt time.Time // zero: no exec yet
	EndedAt     time.Time // zero: still live
	Reason      string
	TTLExtended bool
	Actions     int64
	Blocked     int64
	Tokens      int64
}

// AddUsage records a new sandbox's usage row.
func (s *Store) AddUsage(ctx context.Context, u Usage) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO sandbox_usage (id, project_path, node, tier, environment, created_at) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO NOTHING`, u.ID, u.ProjectPath, u.Node, u.Tier, u.Environment, u.CreatedAt.UnixNano())
	if err != nil {
		return fmt.Errorf("record usage of %s: %w", u.ID, err)
	}
	return nil
}

// UsageFirstExec records a sandbox's first exec, once.
func (s *Store) UsageFirstExec(ctx context.Context, id string, at time.Time) error {
	_, err := s.db.ExecContext(ctx, `UPDATE sandbox_usage SET first_exec_at = ? WHERE id = ? AND first_exec_at = 0`, at.UnixNano(), id)
	if err != nil {
		return fmt.Errorf("record first exec of %s: %w", id, err)
	}
	return nil
}

// UsageExtended marks a sandbox whose TTL was extended.
func (s *Store) UsageExtended(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE sandbox_usage SET ttl_extended = 1 WHERE id = ?`, id); err != nil {
		return fmt.Errorf("record TTL extension of %s: %w", id, err)
	}
	return nil
}

// UsageCounters sets a sandbox's counters.
func (s *Store) UsageCounters(ctx context.Context, id string, actions, blocked, tokens int64) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE sandbox_usage SET actions = ?, blocked = ?, tokens = ? WHERE id = ?`,
		actions, blocked, tokens, id); err != nil {
		return fmt.Errorf("record usage of %s: %w", id, err)
	}
	return nil
}

// UsageEnded records how a sandbox ended.
func (s *Store) UsageEnded(ctx context.Context, id string, at time.Time, reason string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE sandbox_usage SET ended_at = ?, reason = ? WHERE id = ? AND ended_at = 0`,
		at.UnixNano(), reason, id); err != nil {
		return fmt.Errorf("record the end of %s: %w", id, err)
	}
	return nil
}

// ListUsage returns the usage rows of sandboxes of the canonical project's subtree created at
// or after since.
func (s *Store) ListUsage(ctx context.Context, project string, since time.Time) ([]Usage, error) {
	cond, args := subtreeCond("project_path", project)
	args = append([]any{since.UnixNano()}, args...)
	rows, err := s.rdb.QueryContext(ctx, `SELECT id, project_path, node, tier, environment, created_at, first_exec_at, ended_at, reason,
		ttl_extended, actions, blocked, tokens FROM sandbox_usage WHERE created_at >= ? AND `+cond+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("list usage: %w", err)
	}
	defer rows.Close()
	var out []Usage
	for rows.Next() {
		var u Usage
		var created, first, ended, ext int64
		if err := rows.Scan(&u.ID, &u.ProjectPath, &u.Node, &u.Tier, &u.Environment, &created, &first, &ended, &u.Reason,
			&ext, &u.Actions, &u.Blocked, &u.Tokens); err != nil {
			return nil, fmt.Errorf("list usage: %w", err)
		}
		u.CreatedAt = time.Unix(0, created).UTC()
		if first > 0 {
			u.FirstExecAt = time.Unix(0, first).UTC()
		}
		if ended > 0 {
			u.EndedAt = time.Unix(0, ended).UTC()
		}
		u.TTLExtended = ext != 0
		out = append(out, u)
	}
	return out, rows.Err()
}

// Activity is what a live sandbox did, as its edge reports it in a batch (RecordActivity): zero
// fields say nothing changed.
type Activity struct {
	ID string `json:"id"`
	// LastActivityAt is when the sandbox was last used.
	LastActivityAt time.Time `json:"last_activity_at,omitzero"`
	// Counters are its usage counters' totals so far (UsageCounters), when they moved.
	Counters *UsageCounts `json:"counters,omitempty"`
	// FirstExecAt is when its first exec came (UsageFirstExec).
	FirstExecAt time.Time `json:"first_exec_at,omitzero"`
	// Created asks for its usage row (AddUsage), made from its record: the servers take its
	// project, tier, environment and create time from there, not from the edge. Any entry that
	// writes the usage row makes it first when missing, so a lost Created costs nothing.
	Created bool `json:"created,omitempty"`
	// EndedAt and EndReason record how it ended (UsageEnded).
	EndedAt   time.Time `json:"ended_at,omitzero"`
	EndReason string    `json:"end_reason,omitempty"`
	// TTLExtended records that its TTL was extended (UsageExtended).
	TTLExtended bool `json:"ttl_extended,omitempty"`
}

// writesUsage reports whether a touches the sandbox's usage row.
func (a *Activity) writesUsage() bool {
	return a.Created || a.Counters != nil || !a.FirstExecAt.IsZero() || !a.EndedAt.IsZero() || a.TTLExtended
}

// UsageCounts are a sandbox's usage counters: actions (API calls into it), blocked egress
// attempts, and the tokens its agent reported.
type UsageCounts struct {
	Actions int64 `json:"actions"`
	Blocked int64 `json:"blocked"`
	Tokens  int64 `json:"tokens"`
}

// RecordActivity records acts of sandboxes of node for its incarnation epoch, in one
// transaction with the check that epoch is still the node's (ErrFenced otherwise). Each write
// names the node, so a sandbox of another node is left as it is; a last activity and the
// counters only move forward, a first exec is kept once recorded, and a time ahead of now is
// taken as now (an edge's clock ahead of the servers' would otherwise pin a sandbox's last
// activity in the future). It writes columns and no record's document, so it races none of the
// edge's record writes.
func (s *Store) RecordActivity(ctx context.Context, node string, epoch int64, acts []Activity) error {
	now := time.Now()
	for i := range acts {
		for _, t := range []*time.Time{&acts[i].LastActivityAt, &acts[i].FirstExecAt, &acts[i].EndedAt} {
			if t.After(now) {
				*t = now
			}
		}
	}
	err := s.tx(ctx, func(tx *Tx) error {
		if err := readEpoch(ctx, tx, node, epoch); err != nil {
			return err
		}
		for _, a := range acts {
			if a.writesUsage() {
				if err := ensureUsage(ctx, tx, node, a.ID); err != nil {
					return err
				}
			}
			if !a.LastActivityAt.IsZero() {
				if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET activity_ns = ? WHERE id = ? AND node = ? AND activity_ns < ?`,
					a.LastActivityAt.UnixNano(), a.ID, node, a.LastActivityAt.UnixNano()); err != nil {
					return err
				}
			}
			if c := a.Counters; c != nil {
				// Forward only: a batch that arrives late (a retry, a periodic batch overtaken by
				// the final one) takes nothing back.
				if _, err := tx.ExecContext(ctx, `UPDATE sandbox_usage SET
					actions = CASE WHEN actions < ? THEN ? ELSE actions END,
					blocked = CASE WHEN blocked < ? THEN ? ELSE blocked END,
					tokens = CASE WHEN tokens < ? THEN ? ELSE tokens END WHERE id = ? AND node = ?`,
					c.Actions, c.Actions, c.Blocked, c.Blocked, c.Tokens, c.Tokens, a.ID, node); err != nil {
					return err
				}
			}
			if !a.FirstExecAt.IsZero() {
				if _, err := tx.ExecContext(ctx, `UPDATE sandbox_usage SET first_exec_at = ? WHERE id = ? AND node = ? AND first_exec_at = 0`,
					a.FirstExecAt.UnixNano(), a.ID, node); err != nil {
					return err
				}
			}
			if !a.EndedAt.IsZero() {
				if _, err := tx.ExecContext(ctx, `UPDATE sandbox_usage SET ended_at = ?, reason = ? WHERE id = ? AND node = ? AND ended_at = 0`,
					a.EndedAt.UnixNano(), a.EndReason, a.ID, node); err != nil {
					return err
				}
			}
			if a.TTLExtended {
				if _, err := tx.ExecContext(ctx, `UPDATE sandbox_usage SET ttl_extended = 1 WHERE id = ? AND node = ?`, a.ID, node); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record the activity of %d sandboxes of node %s: %w", len(acts), node, err)
	}
	return nil
}

// ensureUsage makes the usage row of node's sandbox id from its record when it has none: the
// project, tier, environment and create time are the record's. A sandbox the node does not run,
// or a fncall pool container (no usage row), gets none.
func ensureUsage(ctx context.Context, tx *Tx, node, id string) error {
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM sandbox_usage WHERE id = ?`, id).Scan(&one)
	if err == nil {
		return nil // the usual case: one index lookup, no record read
	} else if !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	var doc, pid, path string
	var activity int64
	err = tx.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes s LEFT JOIN projects p ON p.id = s.project_id
		WHERE s.id = ? AND s.node = ?`, id, node).Scan(&doc, &pid, &path, &activity)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	} else if err != nil {
		return err
	}
	sb, err := decodeSandbox(doc, pid, path, activity)
	if err != nil {
		return fmt.Errorf("decode sandbox %s: %w", id, err)
	}
	if sb.Tier == "fncall" {
		return nil
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO sandbox_usage (id, project_path, node, tier, environment, created_at) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO NOTHING`, id, path, node, sb.Tier, sb.Environment, sb.CreatedAt.UnixNano())
	return err
}

// readEpoch fails with ErrFenced unless epoch is node's current incarnation and the node is not
// lost, reading the node's row without locking it.
func readEpoch(ctx context.Context, tx *Tx, node string, epoch int64) error {
	var cur int64
	var state string
	err := tx.QueryRowContext(ctx, `SELECT epoch, state FROM nodes WHERE name = ?`, node).Scan(&cur, &state)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && (cur != epoch || state == NodeLost)) {
		return fmt.Errorf("node %s epoch %d: %w", node, epoch, ErrFenced)
	}
	return err
}
