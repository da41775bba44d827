package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
)

// usageRow is one sandbox's share of its project's usage.
type usageRow struct {
	project, tier string
	cpus          float64
	memory, disk  int64
}

// ancestorIDs returns the IDs of the project with this ID and of all its ancestors.
func ancestorIDs(ctx context.Context, q querier, projectID string) ([]string, error) {
	var path string
	if err := q.QueryRowContext(ctx, `SELECT path FROM projects WHERE id = ?`, projectID).Scan(&path); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, errdefs.NotFound("project %s", projectID)
		}
		return nil, err
	}
	return idsOfPaths(ctx, q, iam.Ancestors(path))
}

// idsOfPaths returns the IDs of the projects at these canonical paths.
func idsOfPaths(ctx context.Context, q querier, paths []string) ([]string, error) {
	if len(paths) == 0 {
		return nil, nil
	}
	args := make([]any, len(paths))
	for i, p := range paths {
		args[i] = p
	}
	rows, err := q.QueryContext(ctx, `SELECT id FROM projects WHERE path IN (?`+strings.Repeat(", ?", len(paths)-1)+`)`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// addUsage adds sign × u to the subtree usage of u's project and of every ancestor.
func addUsage(ctx context.Context, q querier, u usageRow, sign int64) error {
	ids, err := ancestorIDs(ctx, q, u.project)
	if err != nil {
		return err
	}
	return addUsageTo(ctx, q, ids, model.Usage{Sandboxes: sign, CPUs: float64(sign) * u.cpus, MemoryBytes: sign * u.memory,
		DiskBytes: sign * u.disk, Tiers: map[string]int64{u.tier: sign}})
}

// addUsageTo adds d to the usage rows of the projects ids.
func addUsageTo(ctx context.Context, q querier, ids []string, d model.Usage) error {
	if len(ids) == 0 {
		return nil
	}
	ids = slices.Sorted(slices.Values(ids))
	if err := lockUsage(ctx, q, ids); err != nil {
		return err
	}
	in := `(?` + strings.Repeat(", ?", len(ids)-1) + `)`
	args := []any{d.Sandboxes, d.CPUs, d.MemoryBytes, d.DiskBytes}
	for _, id := range ids {
		args = append(args, id)
	}
	if _, err := q.ExecContext(ctx, `UPDATE project_usage SET sandboxes = sandboxes + ?, cpus = cpus + ?,
		memory_bytes = memory_bytes + ?, disk_bytes = disk_bytes + ? WHERE project_id IN `+in, args...); err != nil {
		return err
	}
	for tier, n := range d.Tiers {
		if n == 0 {
			continue
		}
		for _, id := range ids {
			if _, err := q.ExecContext(ctx, `INSERT INTO project_tier_usage (project_id, tier, sandboxes) VALUES (?, ?, ?)
				ON CONFLICT (project_id, tier) DO UPDATE SET sandboxes = project_tier_usage.sandboxes + excluded.sandboxes`, id, tier, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// lockUsage locks the usage rows of the projects ids, in ID order so that transactions locking
// overlapping sets never wait on each other in a circle (PostgreSQL; SQLite runs one writer).
func lockUsage(ctx context.Context, q querier, ids []string) error {
	if !q.postgres() || len(ids) == 0 {
		return nil
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	rows, err := q.QueryContext(ctx, `SELECT project_id FROM project_usage WHERE project_id IN (?`+strings.Repeat(", ?", len(ids)-1)+
		`) ORDER BY project_id FOR UPDATE`, args...)
	if err != nil {
		return err
	}
	return rows.Close()
}

// lockProject locks the row of the project at a canonical path (PostgreSQL), so that checks
// reading it and its children (delegation sums) cannot interleave with another transaction's.
func lockProject(ctx context.Context, q querier, path string) error {
	if !q.postgres() {
		return nil
	}
	rows, err := q.QueryContext(ctx, `SELECT id FROM projects WHERE path = ?`+forUpdate(q), path)
	if err != nil {
		return err
	}
	return rows.Close()
}

// readUsage returns the subtree usage counters of one project; per-tier counts and creations in
// the last minute only when asked (the latter counted from the rows).
func readUsage(ctx context.Context, q querier, p *ProjectRecord, tiers, creates bool, now time.Time) (model.Usage, error) {
	var u model.Usage
	err := q.QueryRowContext(ctx, `SELECT sandboxes, cpus, memory_bytes, disk_bytes FROM project_usage WHERE project_id = ?`, p.ID).
		Scan(&u.Sandboxes, &u.CPUs, &u.MemoryBytes, &u.DiskBytes)
	if err != nil {
		return u, err
	}
	u.CPUs = math.Round(u.CPUs*1e6) / 1e6 // sums of fractions drift in the last bits
	if tiers {
		if u.Tiers, err = tierUsage(ctx, q, p.ID); err != nil {
			return u, err
		}
	}
	if creates {
		cond, args := subtreeCond("path", p.Path)
		err := q.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes WHERE created_ns > ? AND project_id IN (SELECT id FROM projects WHERE `+cond+`)`,
			append([]any{now.Add(-time.Minute).UnixNano()}, args...)...).Scan(&u.CreatesPerMinute)
		if err != nil {
			return u, err
		}
	}
	return u, nil
}

// tierUsage returns the live sandboxes per tier in a project's subtree.
func tierUsage(ctx context.Context, q querier, projectID string) (map[string]int64, error) {
	rows, err := q.QueryContext(ctx, `SELECT tier, sandboxes FROM project_tier_usage WHERE project_id = ? AND sandboxes != 0`, projectID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out map[string]int64
	for rows.Next() {
		var t string
		var n int64
		if err := rows.Scan(&t, &n); err != nil {
			return nil, err
		}
		if out == nil {
			out = map[string]int64{}
		}
		out[t] = n
	}
	return out, rows.Err()
}

// RecountUsage rebuilds every project's usage counters from the sandbox rows. Corral runs it at
// start, so a counter can never stay wrong across a restart.
func (s *Store) RecountUsage(ctx context.Context) error {
	err := s.tx(ctx, func(tx *Tx) error {
		for _, q := range []string{
			`DELETE FROM project_tier_usage`,
			`INSERT INTO project_usage (project_id) SELECT id FROM projects WHERE id NOT IN (SELECT project_id FROM project_usage)`,
			`DELETE FROM project_usage WHERE project_id NOT IN (SELECT id FROM projects)`,
			`UPDATE project_usage SET sandboxes = 0, cpus = 0, memory_bytes = 0, disk_bytes = 0`,
		} {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return err
			}
		}
		rows, err := tx.QueryContext(ctx, `SELECT project_id, tier, cpus, memory_bytes, disk_bytes + trajectory_bytes FROM sandboxes WHERE state IN `+liveStatesSQL)
		if err != nil {
			return err
		}
		var live []usageRow
		for rows.Next() {
			var u usageRow
			if err := rows.Scan(&u.project, &u.tier, &u.cpus, &u.memory, &u.disk); err != nil {
				rows.Close()
				return err
			}
			live = append(live, u)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, u := range live {
			if err := addUsage(ctx, tx, u, 1); err != nil {
				return err
			}
		}
		return recountVolumes(ctx, tx)
	})
	if err != nil {
		return fmt.Errorf("recount project usage: %w", err)
	}
	return nil
}

// delegated sums the limits that parent's children hold, per resource.
func delegated(ctx context.Context, q querier, parentID, skipID string) (model.Quota, error) {
	rows, err := q.QueryContext(ctx, `SELECT quota FROM projects WHERE parent_id = ? AND id != ? AND quota != '{}'`, parentID, skipID)
	if err != nil {
		return model.Quota{}, err
	}
	defer rows.Close()
	var sum model.Quota
	for rows.Next() {
		var doc string
		var c model.Quota
		if err := rows.Scan(&doc); err != nil {
			return sum, err
		}
		if err := json.Unmarshal([]byte(doc), &c); err != nil {
			return sum, err
		}
		sum = addQuota(sum, c)
	}
	return sum, rows.Err()
}

func addI(a, b *int64) *int64 {
	if b == nil {
		return a
	}
	v := *b
	if a != nil {
		v += *a
	}
	return &v
}

func addQuota(a, b model.Quota) model.Quota {
	a.Sandboxes = addI(a.Sandboxes, b.Sandboxes)
	a.MemoryBytes = addI(a.MemoryBytes, b.MemoryBytes)
	a.DiskBytes = addI(a.DiskBytes, b.DiskBytes)
	a.CreatesPerMinute = addI(a.CreatesPerMinute, b.CreatesPerMinute)
	a.ArtifactBytes = addI(a.ArtifactBytes, b.ArtifactBytes)
	if b.CPUs != nil {
		v := *b.CPUs
		if a.CPUs != nil {
			v += *a.CPUs
		}
		a.CPUs = &v
	}
	for t, n := range b.Tiers {
		if a.Tiers == nil {
			a.Tiers = map[string]int64{}
		}
		a.Tiers[t] += n
	}
	return a
}

// limitItem is one resource of a quota, for checks that treat them alike.
type limitItem struct {
	name  string
	limit *float64
	value float64
}

func f64(p *int64) *float64 {
	if p == nil {
		return nil
	}
	v := float64(*p)
	return &v
}

// items lists q's resources with the amounts of the same resources in u (a Quota used as a sum).
func items(q, u model.Quota) []limitItem {
	val := func(p *int64) float64 {
		if p == nil {
			return 0
		}
		return float64(*p)
	}
	cpus := 0.0
	if u.CPUs != nil {
		cpus = *u.CPUs
	}
	out := []limitItem{
		{"sandboxes", f64(q.Sandboxes), val(u.Sandboxes)},
		{"cpus", q.CPUs, cpus},
		{"memory_bytes", f64(q.MemoryBytes), val(u.MemoryBytes)},
		{"disk_bytes", f64(q.DiskBytes), val(u.DiskBytes)},
		{"creates_per_minute", f64(q.CreatesPerMinute), val(u.CreatesPerMinute)},
		{"artifact_bytes", f64(q.ArtifactBytes), val(u.ArtifactBytes)},
	}
	for _, t := range slices.Sorted(maps.Keys(q.Tiers)) {
		l := float64(q.Tiers[t])
		out = append(out, limitItem{"tiers." + t, &l, float64(u.Tiers[t])})
	}
	return out
}

// ValidateQuota checks that a quota's numbers are sane.
func ValidateQuota(q model.Quota) error {
	for _, it := range items(q, model.Quota{}) {
		if it.limit != nil && *it.limit < 0 {
			return errdefs.Invalid(it.name, "a limit cannot be negative (%g)", *it.limit)
		}
	}
	for t := range q.Tiers {
		switch t {
		case "container", "fncall", "microvm", "vm":
		default:
			return errdefs.Invalid("tiers", "%q is not a tier (container, fncall, microvm, vm)", t)
		}
	}
	return nil
}

// limitsOf maps each resource q limits to its limit.
func limitsOf(q model.Quota) map[string]float64 {
	out := map[string]float64{}
	for _, it := range items(q, model.Quota{}) {
		if it.limit != nil {
			out[it.name] = *it.limit
		}
	}
	return out
}

// checkDelegation checks that child (ID childID, or a new child when empty) may hold limit want
// under parent: for every resource both limit, the children's limits (want included) sum to at
// most the parent's. A resource the child does not limit is bounded by the parent's anyway.
func checkDelegation(ctx context.Context, q querier, parent *ProjectRecord, childID string, want model.Quota) error {
	others, err := delegated(ctx, q, parent.ID, childID)
	if err != nil {
		return err
	}
	have, mine := limitsOf(parent.Quota), limitsOf(want)
	taken := limitsOf(others)
	for _, name := range slices.Sorted(maps.Keys(mine)) {
		limit, ok := have[name]
		if !ok {
			continue
		}
		if taken[name]+mine[name] > limit+1e-9 {
			return errdefs.Conflict("project %s can delegate at most %g more %s (its limit %g, its other subprojects hold %g), not %g",
				iam.Display(parent.Path), max(limit-taken[name], 0), name, limit, taken[name], mine[name])
		}
	}
	return nil
}

// GetQuota returns the limits, subtree usage and delegations of the project at a canonical path.
func (s *Store) GetQuota(ctx context.Context, path string) (*model.ProjectQuota, error) {
	p, err := getProject(ctx, s.rdb, path)
	if err != nil {
		return nil, err
	}
	u, err := readUsage(ctx, s.rdb, p, true, true, time.Now())
	if err != nil {
		return nil, fmt.Errorf("quota of %s: %w", iam.Display(path), err)
	}
	d, err := delegated(ctx, s.db, p.ID, "")
	if err != nil {
		return nil, fmt.Errorf("quota of %s: %w", iam.Display(path), err)
	}
	return &model.ProjectQuota{Project: iam.Display(path), Limit: p.Quota, Usage: u, Delegated: d}, nil
}

// SetQuota replaces the limits of the project at a canonical path. They must fit what the parent
// can still delegate, and be no lower than what the project's children already hold (usage
// above a new limit is allowed: live sandboxes stay, new ones are refused).
func (s *Store) SetQuota(ctx context.Context, path string, q model.Quota) (*model.ProjectQuota, error) {
	if err := ValidateQuota(q); err != nil {
		return nil, err
	}
	err := s.tx(ctx, func(tx *Tx) error {
		if parent, ok := iam.Parent(path); ok {
			if err := lockProject(ctx, tx, parent); err != nil {
				return err
			}
		}
		if err := lockProject(ctx, tx, path); err != nil {
			return err
		}
		p, err := getProject(ctx, tx, path)
		if err != nil {
			return err
		}
		if parent, ok := iam.Parent(path); ok {
			pp, err := getProject(ctx, tx, parent)
			if err != nil {
				return err
			}
			if err := checkDelegation(ctx, tx, pp, p.ID, q); err != nil {
				return err
			}
		}
		children, err := delegated(ctx, tx, p.ID, "")
		if err != nil {
			return err
		}
		for _, it := range items(q, children) {
			if it.limit != nil && it.value > *it.limit {
				return errdefs.Conflict("project %s: %s limit %g is below the %g its subprojects hold; lower theirs first",
					iam.Display(path), it.name, *it.limit, it.value)
			}
		}
		doc, err := json.Marshal(q)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE projects SET quota = ? WHERE id = ?`, string(doc), p.ID); err != nil {
			return err
		}
		// A new creation rate starts with a full bucket.
		_, err = tx.ExecContext(ctx, `UPDATE project_usage SET bucket = 0, bucket_ns = 0 WHERE project_id = ?`, p.ID)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("set quota of %s: %w", iam.Display(path), err)
	}
	return s.GetQuota(ctx, path)
}

// Idempotency is a create's idempotency key: the principal that sent it, the key, and a hash of
// the request it came with.
type Idempotency struct {
	Principal   string `json:"principal"`
	Key         string `json:"key"`
	RequestHash string `json:"request_hash"`
}

// ReplayError says that a create's idempotency key was used before, for the same request: the
// sandbox that request made is the answer.
type ReplayError struct {
	SandboxID string
	// Record is that sandbox's record when the servers answered it with the replay (a
	// cluster's edge, for a sandbox of another node, whose record it does not hold); nil
	// otherwise.
	Record *Sandbox
}

func (e *ReplayError) Error() string { return "idempotent replay of the create of " + e.SandboxID }

// IdempotencyTTL is how long a create's idempotency key is remembered.
const IdempotencyTTL = 24 * time.Hour

// lookupIdempotency returns the sandbox an earlier create with key made: a *ReplayError, or a
// conflict when the key came with another request, or nil when the key is new (or expired).
func lookupIdempotency(ctx context.Context, q querier, key *Idempotency) error {
	var hash, id string
	err := q.QueryRowContext(ctx, `SELECT request_hash, sandbox_id FROM idempotency WHERE principal = ? AND idem_key = ? AND created_at > ?`,
		key.Principal, key.Key, time.Now().Add(-IdempotencyTTL).UnixNano()).Scan(&hash, &id)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return err
	case hash != key.RequestHash:
		return errdefs.Conflict("idempotency key %q was used for another request (it made %s); use a new key for a new request", key.Key, id)
	}
	return &ReplayError{SandboxID: id}
}

// CheckIdempotency answers a create before any work: a *ReplayError when the key made a sandbox
// already, a conflict when it came with another request, nil when it is new.
func (s *Store) CheckIdempotency(ctx context.Context, key *Idempotency) error {
	return lookupIdempotency(ctx, s.rdb, key)
}

// ReleaseIdempotency forgets key if it still names sandboxID, so that the next create with it makes
// a new sandbox: for a create that was rolled back (cut short by a crash) and left nothing but a
// failed record.
func (s *Store) ReleaseIdempotency(ctx context.Context, key *Idempotency, sandboxID string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM idempotency WHERE principal = ? AND idem_key = ? AND sandbox_id = ?`,
		key.Principal, key.Key, sandboxID); err != nil {
		return fmt.Errorf("release idempotency key of %s: %w", sandboxID, err)
	}
	return nil
}

// PruneIdempotency forgets keys older than IdempotencyTTL.
func (s *Store) PruneIdempotency(ctx context.Context) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM idempotency WHERE created_at <= ?`, time.Now().Add(-IdempotencyTTL).UnixNano())
	if err != nil {
		return 0, fmt.Errorf("prune idempotency keys: %w", err)
	}
	return res.RowsAffected()
}

// AdmitSandbox records a new sandbox (state creating) if the quotas of its project and of every
// ancestor allow it, in one transaction: concurrent admissions are serialised by the store's
// write lock, so a quota of N admits exactly N. A refusal is an *iam.QuotaError. With key, the
// same transaction records the idempotency key; a create that raced with the same key finds it
// taken and gets a *ReplayError naming the sandbox the other one made.
//
// The transaction runs to its end even when ctx ends: PostgreSQL may apply a COMMIT whose
// client context has just ended, and the caller would take the admission for failed while a
// "creating" record nobody owns stays behind (its delete then answers "retry" for ever). A
// caller whose client left fails at its next step and records the failure.
func (s *Store) AdmitSandbox(ctx context.Context, sb *Sandbox, key *Idempotency) error {
	return s.admitSandbox(ctx, nil, sb, key)
}

// AdmitNodeSandbox is AdmitSandbox for one of node's sandboxes, as node's incarnation epoch
// asks for it (a cluster's edge, through the servers): the epoch is checked in the same
// transaction (ErrFenced when it was fenced off), and the record must be node's, in state
// creating, with limits a quota can count (ErrInvalid, ErrDenied). Each of its volumes must be
// of the sandbox's project. A record this incarnation already admitted (an answer that broke
// off, asked again) is admitted: the call is idempotent.
func (s *Store) AdmitNodeSandbox(ctx context.Context, node string, epoch int64, sb *Sandbox, key *Idempotency) error {
	fence, err := nodeFence(ctx, node, epoch, []*Sandbox{sb})
	if err != nil {
		return err
	}
	return admittedOnce(s.admitSandbox(ctx, fence, sb, key))
}

// nodeFence checks what node's incarnation epoch asks to admit (checkNodeAdmission), and
// returns the fence of its admission: the epoch checked with the node's row locked to share,
// then errAdmitted when an earlier try of the same admission committed (admittedBefore).
func nodeFence(ctx context.Context, node string, epoch int64, sbs []*Sandbox) (func(*Tx) error, error) {
	for _, sb := range sbs {
		if err := checkNodeAdmission(node, sb); err != nil {
			return nil, err
		}
	}
	return func(tx *Tx) error {
		if err := shareEpoch(ctx, tx, node, epoch); err != nil {
			return err
		}
		for _, sb := range sbs {
			if err := admittedBefore(ctx, tx, node, sb.ID); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

// admittedOnce is an admission's outcome with an earlier try's commit (errAdmitted) taken as
// this one's.
func admittedOnce(err error) error {
	if errors.Is(err, errAdmitted) {
		return nil
	}
	return err
}

// admitSandbox is AdmitSandbox with fence, the check that the writer may still write, run
// first in the transaction (nil: none, corral up's own edge).
func (s *Store) admitSandbox(ctx context.Context, fence func(*Tx) error, sb *Sandbox, key *Idempotency) error {
	ctx = context.WithoutCancel(ctx)
	if sb.ProjectID == "" {
		sb.ProjectID = RootProjectID
	}
	err := s.tx(ctx, func(tx *Tx) error {
		if err := runFence(fence, tx); err != nil {
			return err
		}
		if key != nil {
			if err := lookupIdempotency(ctx, tx, key); err != nil {
				return err
			}
		}
		want := model.Usage{Sandboxes: 1, CPUs: sb.Limits.CPUs, MemoryBytes: sb.Limits.MemoryBytes, DiskBytes: sb.Limits.DiskBytes,
			CreatesPerMinute: 1, Tiers: map[string]int64{sb.Tier: 1}}
		now := time.Now()
		limited, err := checkQuotas(ctx, tx, sb.ProjectID, want, now)
		if err != nil {
			return err
		}
		// The creation rate: a token bucket per limited project, N creations a minute in bursts
		// of up to N. Taken only once every other check passed.
		for i := len(limited) - 1; i >= 0; i-- {
			if err := takeCreation(ctx, tx, limited[i], now); err != nil {
				return err
			}
		}
		if key != nil {
			// An expired use of the key goes; a concurrent one (PostgreSQL) makes this insert
			// fail on the key, below.
			if _, err := tx.ExecContext(ctx, `DELETE FROM idempotency WHERE principal = ? AND idem_key = ? AND created_at <= ?`,
				key.Principal, key.Key, time.Now().Add(-IdempotencyTTL).UnixNano()); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO idempotency (principal, idem_key, request_hash, sandbox_id, created_at) VALUES (?, ?, ?, ?, ?)`,
				key.Principal, key.Key, key.RequestHash, sb.ID, time.Now().UnixNano()); err != nil {
				return err
			}
		}
		if err := attachVolumes(ctx, tx, sb); err != nil {
			return err
		}
		return insertSandbox(ctx, tx, sb)
	})
	if isUnique(err) && key != nil {
		// A create with the same key committed first (PostgreSQL): answer with its sandbox.
		if rerr := lookupIdempotency(ctx, s.db, key); rerr != nil {
			return rerr
		}
	}
	if re, ok := errors.AsType[*ReplayError](err); ok {
		return re
	}
	if qe, ok := errors.AsType[*iam.QuotaError](err); ok {
		return qe // it names the project and the limit; the refused sandbox's ID would only confuse
	}
	if err != nil {
		return fmt.Errorf("admit sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// errAdmitted says that the record a node's admission asks for is there already, admitted by
// an earlier try of the same call whose answer broke off.
var errAdmitted = errors.New("admitted already")

// admittedBefore returns errAdmitted when node already has a record of sandbox id being
// created (an earlier try of the same admission committed), a conflict when another record
// has the ID, and nil when the ID is free.
func admittedBefore(ctx context.Context, q querier, node, id string) error {
	var owner, state string
	err := q.QueryRowContext(ctx, `SELECT node, state FROM sandboxes WHERE id = ?`, id).Scan(&owner, &state)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return err
	case owner == node && state == model.StateCreating:
		return errAdmitted
	}
	return errdefs.Conflict("sandbox %s has a record already (node %s, %s)", id, owner, state)
}

// checkNodeAdmission checks what node's edge sends for admission: a record of its own in state
// creating, whose limits a quota can count (finite, not negative), with one ID per volume.
func checkNodeAdmission(node string, sb *Sandbox) error {
	l := sb.Limits
	switch {
	case sb.Node != node:
		return fmt.Errorf("sandbox %s: a record of node %q admitted by node %s: %w", sb.ID, sb.Node, node, errdefs.ErrDenied)
	case sb.State != model.StateCreating:
		return errdefs.Invalid("state", "sandbox %s: admission records a sandbox being created, not %q", sb.ID, sb.State)
	case sb.Tier == "":
		return errdefs.Invalid("tier", "sandbox %s: a record names its tier", sb.ID)
	case math.IsNaN(l.CPUs) || math.IsInf(l.CPUs, 0) || l.CPUs < 0 || l.MemoryBytes < 0 || l.DiskBytes < 0:
		return errdefs.Invalid("limits", "sandbox %s: limits %g CPUs, %d memory bytes, %d disk bytes: a quota counts finite limits from 0", sb.ID, l.CPUs, l.MemoryBytes, l.DiskBytes)
	case len(sb.VolumeIDs) != len(sb.Volumes):
		return errdefs.Invalid("volume_ids", "sandbox %s: %d volume IDs for %d volumes", sb.ID, len(sb.VolumeIDs), len(sb.Volumes))
	}
	return nil
}

// checkQuotas checks, in tx, that usage want fits the quotas of the project with this ID and of
// every ancestor, and returns the limited ones, nearest last. On PostgreSQL it first locks their
// usage rows, so that concurrent admissions under a common ancestor take turns.
func checkQuotas(ctx context.Context, tx *Tx, projectID string, want model.Usage, now time.Time) ([]*ProjectRecord, error) {
	var path string
	if err := tx.QueryRowContext(ctx, `SELECT path FROM projects WHERE id = ?`, projectID).Scan(&path); err != nil {
		if err == sql.ErrNoRows {
			return nil, errdefs.NotFound("project %s", projectID)
		}
		return nil, err
	}
	anc := iam.Ancestors(path)
	args := make([]any, len(anc))
	for i, a := range anc {
		args[i] = a
	}
	if tx.pg {
		// Concurrent admissions under a common ancestor take turns here: what they read
		// below is what they change. (SQLite has one writer: nothing to lock.)
		ancIDs, err := idsOfPaths(ctx, tx, anc)
		if err != nil {
			return nil, err
		}
		if err := lockUsage(ctx, tx, slices.Sorted(slices.Values(ancIDs))); err != nil {
			return nil, err
		}
		// A deletion or move that held the locks first may have changed the project.
		var cur string
		if err := tx.QueryRowContext(ctx, `SELECT path FROM projects WHERE id = ?`, projectID).Scan(&cur); errors.Is(err, sql.ErrNoRows) {
			return nil, errdefs.NotFound("project %s (deleted meanwhile)", iam.Display(path))
		} else if err != nil {
			return nil, err
		}
		if cur != path {
			return nil, errdefs.Conflict("project %s moved to %s meanwhile; try again", iam.Display(path), iam.Display(cur))
		}
	}
	rows, err := tx.QueryContext(ctx, `SELECT `+projectCols+` FROM projects WHERE quota != '{}' AND path IN (?`+
		strings.Repeat(", ?", len(anc)-1)+`) ORDER BY path`, args...)
	if err != nil {
		return nil, err
	}
	var limited []*ProjectRecord
	for rows.Next() {
		p, err := scanProject(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		limited = append(limited, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// Nearest first: the most specific refusal is the most useful one.
	for i := len(limited) - 1; i >= 0; i-- {
		p := limited[i]
		u, err := readUsage(ctx, tx, p, len(p.Quota.Tiers) > 0, false, now)
		if err != nil {
			return nil, err
		}
		if err := fits(p, u, want); err != nil {
			return nil, err
		}
	}
	return limited, nil
}

// takeCreation takes one creation from p's rate bucket, or refuses when it is empty.
func takeCreation(ctx context.Context, tx *Tx, p *ProjectRecord, now time.Time) error {
	if p.Quota.CreatesPerMinute == nil {
		return nil
	}
	limit := float64(*p.Quota.CreatesPerMinute)
	var bucket float64
	var at int64
	if err := tx.QueryRowContext(ctx, `SELECT bucket, bucket_ns FROM project_usage WHERE project_id = ?`, p.ID).Scan(&bucket, &at); err != nil {
		return err
	}
	if at == 0 {
		bucket = limit // never used since the limit was set: full
	} else {
		bucket = min(limit, bucket+float64(now.UnixNano()-at)/float64(time.Minute)*limit)
	}
	if bucket < 1 {
		return &iam.QuotaError{QuotaExceeded: iam.QuotaExceeded{
			Project: iam.Display(p.Path), Resource: "creates_per_minute", Limit: limit, Usage: math.Ceil(limit - bucket), Request: 1,
		}}
	}
	_, err := tx.ExecContext(ctx, `UPDATE project_usage SET bucket = ?, bucket_ns = ? WHERE project_id = ?`, bucket-1, now.UnixNano(), p.ID)
	return err
}

// fits checks that usage u plus want stays within p's limits (all but the creation rate).
func fits(p *ProjectRecord, u, want model.Usage) error {
	asQuota := func(u model.Usage) model.Quota {
		return model.Quota{Sandboxes: &u.Sandboxes, CPUs: &u.CPUs, MemoryBytes: &u.MemoryBytes, DiskBytes: &u.DiskBytes,
			CreatesPerMinute: &u.CreatesPerMinute, Tiers: u.Tiers}
	}
	have := items(p.Quota, asQuota(u))
	add := items(p.Quota, asQuota(want))
	for i, it := range have {
		if it.limit == nil || it.name == "creates_per_minute" || add[i].value == 0 {
			continue // a resource the request does not use cannot be what it exceeds
		}
		if it.value+add[i].value > *it.limit+1e-9 {
			return &iam.QuotaError{QuotaExceeded: iam.QuotaExceeded{
				Project: iam.Display(p.Path), Resource: it.name, Limit: *it.limit, Usage: it.value, Request: add[i].value,
			}}
		}
	}
	return nil
}

// ArtifactLimit is a limit on the fncall artifacts of a project's subtree (Quota.ArtifactBytes).
type ArtifactLimit struct {
	Path     string   `json:"path"`     // the limited project, canonical
	Limit    int64    `json:"limit"`    // bytes
	Projects []string `json:"projects"` // the IDs of the projects in its subtree, itself included
}

// ArtifactLimits returns the limits on the artifacts of the project with this ID: its own
// (corral.DefaultArtifactBytes when it sets none) and each of its ancestors' that sets one.
func (s *Store) ArtifactLimits(ctx context.Context, projectID string) ([]ArtifactLimit, error) {
	ids, err := ancestorIDs(ctx, s.rdb, projectID)
	if err != nil {
		return nil, fmt.Errorf("artifact limits: %w", err)
	}
	var out []ArtifactLimit
	for _, id := range ids {
		var path, doc string
		if err := s.rdb.QueryRowContext(ctx, `SELECT path, quota FROM projects WHERE id = ?`, id).Scan(&path, &doc); err != nil {
			return nil, fmt.Errorf("artifact limits: %w", err)
		}
		var q model.Quota
		if err := json.Unmarshal([]byte(doc), &q); err != nil {
			return nil, fmt.Errorf("artifact limits: decode the quota of %s: %w", iam.Display(path), err)
		}
		l := ArtifactLimit{Path: path}
		switch {
		case q.ArtifactBytes != nil:
			l.Limit = *q.ArtifactBytes
		case id == projectID:
			l.Limit = model.DefaultArtifactBytes
		default:
			continue
		}
		if l.Projects, err = s.projectsUnder(ctx, path); err != nil {
			return nil, fmt.Errorf("artifact limits: %w", err)
		}
		out = append(out, l)
	}
	return out, nil
}

// projectsUnder returns the IDs of the project at the canonical path and its descendants.
func (s *Store) projectsUnder(ctx context.Context, path string) ([]string, error) {
	// subtreeCond, not a range to "\xff" for the root: PostgreSQL refuses a string that is not
	// UTF-8.
	cond, args := subtreeCond("path", path)
	rows, err := s.rdb.QueryContext(ctx, `SELECT id FROM projects WHERE `+cond, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// runFence runs an admission's fence (nil: none) in tx.
func runFence(fence func(*Tx) error, tx *Tx) error {
	if fence == nil {
		return nil
	}
	return fence(tx)
}
