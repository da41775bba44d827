package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
)

// RootProjectID is the ID of the root project, which every installation has from migration 7 on.
const RootProjectID = "prj-root"

// RootPrincipal is the principal of the admin token `corral up` writes.
const RootPrincipal = "root"

// liveStates are the states whose sandboxes count against quotas (a powered-off vm keeps its
// reservation: powering it on admits nothing again).
var liveStates = []string{model.StateCreating, model.StateRunning, model.StatePaused, model.StateOff}

const liveStatesSQL = `('creating', 'running', 'paused', 'off')`

// LiveStates returns the live states (a copy of liveStates), for a SandboxFilter.
func LiveStates() []string { return slices.Clone(liveStates) }

// OwnStates returns the states of the records a node may still run when it starts: the live
// ones and deleting (a teardown a restart finishes).
func OwnStates() []string { return append(LiveStates(), model.StateDeleting) }

// TokenRecord is a token as the store keeps it (never the secret, only its hash).
type TokenRecord struct {
	ID          string
	Hash        string
	Principal   string
	ProjectID   string
	ProjectPath string // canonical, filled on reads
	Perms       iam.Perm
	Role        string
	Parent      string
	CreatedAt   time.Time
	ExpiresAt   time.Time // zero: never
	RevokedAt   time.Time // zero: not revoked
}

// View returns the API view of t.
func (t *TokenRecord) View() model.Token {
	v := model.Token{
		ID: t.ID, Principal: t.Principal, Project: iam.Display(t.ProjectPath), Role: t.Role,
		Permissions: t.Perms.Names(), Parent: t.Parent, CreatedAt: t.CreatedAt,
	}
	if !t.ExpiresAt.IsZero() {
		e := t.ExpiresAt
		v.ExpiresAt = &e
	}
	if !t.RevokedAt.IsZero() {
		r := t.RevokedAt
		v.RevokedAt = &r
	}
	return v
}

func unixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

const tokenCols = `t.id, t.hash, t.principal, t.project_id, p.path, t.perms, t.role, t.parent, t.created_at, t.expires_at, t.revoked_at`

func scanToken(row interface{ Scan(...any) error }) (*TokenRecord, error) {
	var t TokenRecord
	var created, expires, revoked int64
	var perms int64
	if err := row.Scan(&t.ID, &t.Hash, &t.Principal, &t.ProjectID, &t.ProjectPath, &perms, &t.Role, &t.Parent, &created, &expires, &revoked); err != nil {
		return nil, err
	}
	t.Perms = iam.Perm(perms)
	t.CreatedAt, t.ExpiresAt, t.RevokedAt = unixNano(created), unixNano(expires), unixNano(revoked)
	return &t, nil
}

// TokenByHash returns the token whose secret hashes to hash, revoked or not, or ErrNotFound. A
// token whose project was deleted is not found.
func (s *Store) TokenByHash(ctx context.Context, hash string) (*TokenRecord, error) {
	t, err := scanToken(s.rdb.QueryRowContext(ctx, `SELECT `+tokenCols+` FROM api_tokens t
		JOIN projects p ON p.id = t.project_id WHERE t.hash = ?`, hash))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.NotFound("token")
	}
	if err != nil {
		return nil, fmt.Errorf("look up token: %w", err)
	}
	return t, nil
}

// GetToken returns the token with this ID.
func (s *Store) GetToken(ctx context.Context, id string) (*TokenRecord, error) {
	t, err := scanToken(s.rdb.QueryRowContext(ctx, `SELECT `+tokenCols+` FROM api_tokens t
		JOIN projects p ON p.id = t.project_id WHERE t.id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.NotFound("token %s", id)
	}
	if err != nil {
		return nil, fmt.Errorf("get token %s: %w", id, err)
	}
	return t, nil
}

// AddRootToken stores the hash of a token of the root principal with every permission on the root
// project (the admin token).
func (s *Store) AddRootToken(ctx context.Context, hash string) error {
	_, id := iam.NewToken()
	_, err := s.db.ExecContext(ctx, `INSERT INTO api_tokens (id, hash, principal, project_id, perms, role, parent, created_at, expires_at, revoked_at)
		VALUES (?, ?, ?, ?, ?, ?, '', ?, 0, 0)`, id, hash, RootPrincipal, RootProjectID, int64(iam.All), model.RoleOwner, time.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("add admin token: %w", err)
	}
	return nil
}

// MintRequest is a token to record, optionally with a new principal and its grant.
type MintRequest struct {
	Token TokenRecord // ID, Hash, Principal, ProjectID, Perms, Role, Parent, ExpiresAt
	// NewPrincipalKind, when set, makes a principal named Token.Principal of this kind
	// (iam.KindService, ...): it is created in the token's project first, and granted GrantRole
	// there.
	NewPrincipalKind string
	GrantRole        string
	CreatedBy        string
	// MaxActive, when set, refuses the token if its principal has that many active tokens.
	MaxActive int
}

// MintToken records a token (and the principal and grant of m) in one transaction.
func (s *Store) MintToken(ctx context.Context, m MintRequest) error {
	now := time.Now().UnixNano()
	err := s.tx(ctx, func(tx *Tx) error {
		var p *model.Principal
		if m.NewPrincipalKind != "" {
			p = &model.Principal{Name: m.Token.Principal, Kind: m.NewPrincipalKind}
		}
		if p != nil {
			if err := insertPrincipal(ctx, tx, *p, m.Token.ProjectID, m.CreatedBy); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO grants (project_id, principal, role, created_at, created_by) VALUES (?, ?, ?, ?, ?)`,
				m.Token.ProjectID, p.Name, m.GrantRole, now, m.CreatedBy); err != nil {
				return err
			}
		} else {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM principals WHERE name = ?`, m.Token.Principal).Scan(&n); err != nil {
				return err
			}
			if n == 0 {
				return errdefs.Invalid("principal", "principal %q does not exist", m.Token.Principal)
			}
		}
		t := m.Token
		if m.MaxActive > 0 {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM api_tokens WHERE principal = ? AND revoked_at = 0 AND (expires_at = 0 OR expires_at > ?)`,
				t.Principal, now).Scan(&n); err != nil {
				return err
			}
			if n >= m.MaxActive {
				return fmt.Errorf("principal %s has %d active tokens, the most it may have; revoke some: %w", t.Principal, n, errdefs.ErrExhausted)
			}
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO api_tokens (id, hash, principal, project_id, perms, role, parent, created_at, expires_at, revoked_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 0)`, t.ID, t.Hash, t.Principal, t.ProjectID, int64(t.Perms), t.Role, t.Parent, now, nanos(t.ExpiresAt))
		return err
	})
	if err != nil {
		return fmt.Errorf("mint token: %w", err)
	}
	return nil
}

// TokenFilter selects tokens in ListTokens; the conditions are ORed (a token matching any is
// listed). Projects are canonical paths whose subtrees match.
type TokenFilter struct {
	Principal string
	Ancestor  string // tokens minted, directly or not, by this token
	Projects  []string
}

// ListTokens returns the tokens matching f, oldest first.
func (s *Store) ListTokens(ctx context.Context, f TokenFilter) ([]*TokenRecord, error) {
	var conds []string
	var args []any
	if f.Principal != "" {
		conds = append(conds, `t.principal = ?`)
		args = append(args, f.Principal)
	}
	for _, p := range f.Projects {
		c, a := subtreeCond("p.path", p)
		conds = append(conds, c)
		args = append(args, a...)
	}
	if len(conds) == 0 && f.Ancestor == "" {
		return nil, nil
	}
	where := "0 = 1"
	if len(conds) > 0 {
		where = strings.Join(conds, " OR ")
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+tokenCols+` FROM api_tokens t JOIN projects p ON p.id = t.project_id
		WHERE `+where+` OR t.id IN (`+descendantTokensSQL+`) ORDER BY t.created_at, t.id`, append(args, f.Ancestor)...)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	defer rows.Close()
	var out []*TokenRecord
	for rows.Next() {
		t, err := scanToken(rows)
		if err != nil {
			return nil, fmt.Errorf("list tokens: %w", err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// descendantTokensSQL selects the IDs of the tokens minted from the token given as its one
// argument, at any depth.
const descendantTokensSQL = `WITH RECURSIVE d(id) AS (
		SELECT id FROM api_tokens WHERE parent = ? AND parent != ''
		UNION SELECT a.id FROM api_tokens a JOIN d ON a.parent = d.id)
	SELECT id FROM d`

// RevokeToken revokes a token and every token minted from it, and returns the token.
func (s *Store) RevokeToken(ctx context.Context, id string) (*TokenRecord, error) {
	now := time.Now().UnixNano()
	err := s.tx(ctx, func(tx *Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE api_tokens SET revoked_at = ? WHERE id = ? AND revoked_at = 0`, now, id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			var c int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM api_tokens WHERE id = ?`, id).Scan(&c); err != nil {
				return err
			}
			if c == 0 {
				return errdefs.NotFound("token %s", id)
			}
		}
		_, err = tx.ExecContext(ctx, `UPDATE api_tokens SET revoked_at = ? WHERE revoked_at = 0 AND id IN (`+descendantTokensSQL+`)`, now, id)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("revoke token %s: %w", id, err)
	}
	return s.GetToken(ctx, id)
}

// subtreeCond returns a condition on col (a canonical path column) that holds for p and its
// descendants, with its arguments. It compares by range, so an index on col serves it.
func subtreeCond(col, p string) (string, []any) {
	if p == "" {
		return "1 = 1", nil
	}
	lo, hi := iam.SubtreeRange(p)
	return "(" + col + " = ? OR (" + col + " > ? AND " + col + " < ?))", []any{p, lo, hi}
}

// GrantRow is one grant with its project's current path.
type GrantRow struct {
	model.Grant
	ProjectPath string // canonical
}

// PrincipalGrants returns the grants of principal that matter to a token scoped to scope: those
// on scope's ancestors and those inside its subtree.
func (s *Store) PrincipalGrants(ctx context.Context, principal, scope string) ([]GrantRow, error) {
	anc := iam.Ancestors(scope)
	cond, args := subtreeCond("p.path", scope)
	q := `SELECT p.path, g.role FROM grants g JOIN projects p ON p.id = g.project_id
		WHERE g.principal = ? AND (p.path IN (?` + strings.Repeat(", ?", len(anc)-1) + `) OR ` + cond + `)`
	all := []any{principal}
	for _, a := range anc {
		all = append(all, a)
	}
	rows, err := s.rdb.QueryContext(ctx, q, append(all, args...)...)
	if err != nil {
		return nil, fmt.Errorf("grants of %s: %w", principal, err)
	}
	defer rows.Close()
	var out []GrantRow
	for rows.Next() {
		var g GrantRow
		if err := rows.Scan(&g.ProjectPath, &g.Role); err != nil {
			return nil, err
		}
		g.Principal = principal
		out = append(out, g)
	}
	return out, rows.Err()
}

// ProjectRecord is a project row.
type ProjectRecord struct {
	ID        string
	Path      string // canonical
	ParentID  string
	CreatedAt time.Time
	CreatedBy string
	Quota     model.Quota
}

// View returns the API view of p.
func (p *ProjectRecord) View() model.Project {
	v := model.Project{ID: p.ID, Path: iam.Display(p.Path), CreatedAt: p.CreatedAt, CreatedBy: p.CreatedBy}
	if parent, ok := iam.Parent(p.Path); ok {
		v.Parent = iam.Display(parent)
	}
	return v
}

const projectCols = `id, path, COALESCE(parent_id, ''), created_at, created_by, quota`

func scanProject(row interface{ Scan(...any) error }) (*ProjectRecord, error) {
	var p ProjectRecord
	var created int64
	var quota string
	if err := row.Scan(&p.ID, &p.Path, &p.ParentID, &created, &p.CreatedBy, &quota); err != nil {
		return nil, err
	}
	p.CreatedAt = unixNano(created)
	if err := json.Unmarshal([]byte(quota), &p.Quota); err != nil {
		return nil, fmt.Errorf("decode quota of project %s: %w", iam.Display(p.Path), err)
	}
	return &p, nil
}

// querier is a conn or a Tx.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	postgres() bool
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func getProject(ctx context.Context, q querier, path string) (*ProjectRecord, error) {
	p, err := scanProject(q.QueryRowContext(ctx, `SELECT `+projectCols+` FROM projects WHERE path = ?`, path))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.NotFound("project %s", iam.Display(path))
	}
	if err != nil {
		return nil, fmt.Errorf("get project %s: %w", iam.Display(path), err)
	}
	return p, nil
}

// GetProject returns the project at a canonical path.
func (s *Store) GetProject(ctx context.Context, path string) (*ProjectRecord, error) {
	return getProject(ctx, s.rdb, path)
}

// ProjectPath returns the canonical path of the project with this ID.
func (s *Store) ProjectPath(ctx context.Context, id string) (string, error) {
	var p string
	err := s.rdb.QueryRowContext(ctx, `SELECT path FROM projects WHERE id = ?`, id).Scan(&p)
	if errors.Is(err, sql.ErrNoRows) {
		return "", errdefs.NotFound("project %s", id)
	}
	return p, err
}

// CreateProject creates a project at a canonical path under an existing parent.
func (s *Store) CreateProject(ctx context.Context, path, createdBy string) (*ProjectRecord, error) {
	parent, ok := iam.Parent(path)
	if !ok {
		return nil, errdefs.Conflict("the root project exists already")
	}
	var out *ProjectRecord
	err := s.tx(ctx, func(tx *Tx) error {
		pp, err := getProject(ctx, tx, parent)
		if errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.NotFound("parent project %s (create it first)", iam.Display(parent))
		} else if err != nil {
			return err
		}
		if _, err := getProject(ctx, tx, path); err == nil {
			return errdefs.Conflict("project %s exists already", iam.Display(path))
		}
		out = &ProjectRecord{ID: iam.NewID("prj-"), Path: path, ParentID: pp.ID, CreatedAt: time.Now().UTC(), CreatedBy: createdBy}
		if _, err := tx.ExecContext(ctx, `INSERT INTO projects (id, path, parent_id, created_at, created_by, quota) VALUES (?, ?, ?, ?, ?, '{}')`,
			out.ID, out.Path, out.ParentID, out.CreatedAt.UnixNano(), createdBy); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO project_usage (project_id) VALUES (?)`, out.ID)
		return err
	})
	if isUnique(err) { // another transaction created it meanwhile (PostgreSQL)
		err = errdefs.Conflict("project %s exists already", iam.Display(path))
	}
	if err != nil {
		return nil, fmt.Errorf("create project %s: %w", iam.Display(path), err)
	}
	return out, nil
}

// ListProjects returns the projects of under's subtree (canonical), parents before children,
// with their live sandbox counts.
func (s *Store) ListProjects(ctx context.Context, under string) ([]model.Project, error) {
	cond, args := subtreeCond("p.path", under)
	rows, err := s.rdb.QueryContext(ctx, `SELECT p.id, p.path, COALESCE(p.parent_id, ''), p.created_at, p.created_by, p.quota,
		(SELECT COUNT(*) FROM sandboxes s WHERE s.project_id = p.id AND s.state IN `+liveStatesSQL+`)
		FROM projects p WHERE `+cond+` ORDER BY p.path`, args...)
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	defer rows.Close()
	out := []model.Project{}
	for rows.Next() {
		var p ProjectRecord
		var created int64
		var quota string
		var n int
		if err := rows.Scan(&p.ID, &p.Path, &p.ParentID, &created, &p.CreatedBy, &quota, &n); err != nil {
			return nil, fmt.Errorf("list projects: %w", err)
		}
		p.CreatedAt = unixNano(created)
		v := p.View()
		v.Sandboxes = n
		out = append(out, v)
	}
	return out, rows.Err()
}

// LiveSandboxesUnder returns the IDs of the live sandboxes in path's subtree.
func (s *Store) LiveSandboxesUnder(ctx context.Context, path string) ([]string, error) {
	cond, args := subtreeCond("p.path", path)
	rows, err := s.rdb.QueryContext(ctx, `SELECT s.id FROM sandboxes s JOIN projects p ON p.id = s.project_id
		WHERE s.state IN `+liveStatesSQL+` AND `+cond+` ORDER BY s.id`, args...)
	if err != nil {
		return nil, fmt.Errorf("live sandboxes under %s: %w", iam.Display(path), err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// DeleteProject deletes the project at path and its subtree: the projects, their grants, the
// principals created in them (with their grants elsewhere), and every token scoped to them or
// belonging to those principals. It is refused while a sandbox of the subtree is live, or an
// environment or fncall environment belongs to it; layers owned by the subtree pass to the
// deleted project's parent, since sandboxes elsewhere may stack on them.
func (s *Store) DeleteProject(ctx context.Context, path string) error {
	parent, ok := iam.Parent(path)
	if !ok {
		return errdefs.Invalid("path", "the root project cannot be deleted")
	}
	err := s.tx(ctx, func(tx *Tx) error {
		if err := lockTree(ctx, tx, path); err != nil {
			return err
		}
		p, err := getProject(ctx, tx, path)
		if err != nil {
			return err
		}
		pp, err := getProject(ctx, tx, parent)
		if err != nil {
			return err
		}
		cond, args := subtreeCond("path", path)
		sub := `SELECT id FROM projects WHERE ` + cond
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes WHERE state IN `+liveStatesSQL+` AND project_id IN (`+sub+`)`, args...).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return errdefs.Conflict("project %s has %d live sandboxes; delete them or force", iam.Display(path), n)
		}
		for _, t := range []struct{ table, what string }{{"environments", "environment"}, {"fncall_envs", "fncall environment"}, {"volumes", "volume"}} {
			var name string
			err := tx.QueryRowContext(ctx, `SELECT name FROM `+t.table+` WHERE project_id IN (`+sub+`) ORDER BY name LIMIT 1`, args...).Scan(&name)
			if err == nil {
				return errdefs.Conflict("project %s owns %s %s; delete it first", iam.Display(path), t.what, name)
			} else if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
		}
		now := time.Now().UnixNano()
		// Layers pass to the parent, private (public ones stay public): nobody who could not use
		// them before can now.
		if _, err := tx.ExecContext(ctx, `UPDATE layers SET project_id = ?, private = 1 - public WHERE project_id IN (`+sub+`)`, append([]any{pp.ID}, args...)...); err != nil {
			return err
		}
		// Tokens scoped there or of principals created there end, with every token minted from
		// them (marked by this transaction's revocation time).
		owned := `SELECT name FROM principals WHERE project_id IN (` + sub + `)`
		if _, err := tx.ExecContext(ctx, `UPDATE api_tokens SET revoked_at = ? WHERE revoked_at = 0 AND (project_id IN (`+sub+`) OR principal IN (`+owned+`))`,
			append(append([]any{now}, args...), args...)...); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `WITH RECURSIVE d(id) AS (SELECT id FROM api_tokens WHERE revoked_at = ?
				UNION SELECT a.id FROM api_tokens a JOIN d ON a.parent = d.id)
			UPDATE api_tokens SET revoked_at = ? WHERE revoked_at = 0 AND id IN (SELECT id FROM d)`, now, now); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM grants WHERE project_id IN (`+sub+`) OR principal IN (`+owned+`)`, append(append([]any{}, args...), args...)...); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM principals WHERE project_id IN (`+sub+`)`, args...); err != nil {
			return err
		}
		// The subtree's audit entries stay with the parent's auditors (who could read them
		// before), not with a project that takes the same path later.
		if _, err := tx.ExecContext(ctx, `UPDATE audit SET project_id = ? WHERE project_id IN (`+sub+`)`, append([]any{pp.ID}, args...)...); err != nil {
			return err
		}
		// Stopped sandboxes keep their records (history); they now name the parent.
		if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET project_id = ? WHERE project_id IN (`+sub+`)`, append([]any{pp.ID}, args...)...); err != nil {
			return err
		}
		// No sandbox of the subtree is live, so its usage counts nothing above it.
		for _, t := range []string{"project_usage", "project_tier_usage"} {
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+t+` WHERE project_id IN (`+sub+`)`, args...); err != nil {
				return err
			}
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM projects WHERE `+cond, args...)
		_ = p
		return err
	})
	if err != nil {
		return fmt.Errorf("delete project %s: %w", iam.Display(path), err)
	}
	return nil
}

// MoveProject moves the subtree at from to the path to (both canonical). to's parent must exist
// and to must not. Unless force, a live sandbox in the subtree refuses the move. The moved
// project's own limits must fit what its new parent can still delegate.
func (s *Store) MoveProject(ctx context.Context, from, to string, force bool) (*ProjectRecord, error) {
	if from == "" {
		return nil, errdefs.Invalid("from", "the root project cannot be moved")
	}
	if iam.Within(to, from) {
		return nil, errdefs.Invalid("to", "cannot move %s into itself (%s)", iam.Display(from), iam.Display(to))
	}
	newParent, _ := iam.Parent(to)
	err := s.tx(ctx, func(tx *Tx) error {
		if err := lockTree(ctx, tx, from, newParent); err != nil {
			return err
		}
		p, err := getProject(ctx, tx, from)
		if err != nil {
			return err
		}
		np, err := getProject(ctx, tx, newParent)
		if errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.NotFound("parent project %s (create it first)", iam.Display(newParent))
		} else if err != nil {
			return err
		}
		if _, err := getProject(ctx, tx, to); err == nil {
			return errdefs.Conflict("project %s exists already", iam.Display(to))
		}
		if !force {
			cond, args := subtreeCond("path", from)
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes WHERE state IN `+liveStatesSQL+
				` AND project_id IN (SELECT id FROM projects WHERE `+cond+`)`, args...).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return errdefs.Conflict("project %s has %d live sandboxes; move with force, or delete them first", iam.Display(from), n)
			}
		}
		if err := checkDelegation(ctx, tx, np, p.ID, p.Quota); err != nil {
			return err
		}
		// The subtree's usage leaves the ancestors it no longer has and joins its new ones.
		u, err := readUsage(ctx, tx, p, true, false, time.Now())
		if err != nil {
			return err
		}
		oldAnc, newAnc := iam.Ancestors(from), iam.Ancestors(to)
		oldAnc, newAnc = oldAnc[:len(oldAnc)-1], newAnc[:len(newAnc)-1]
		leave, join := slices.DeleteFunc(slices.Clone(oldAnc), func(a string) bool { return slices.Contains(newAnc, a) }),
			slices.DeleteFunc(slices.Clone(newAnc), func(a string) bool { return slices.Contains(oldAnc, a) })
		// The ancestors it joins must have room for what the subtree already runs.
		if u.Sandboxes > 0 {
			for _, a := range join {
				ap, err := getProject(ctx, tx, a)
				if err != nil {
					return err
				}
				if len(limitsOf(ap.Quota)) == 0 {
					continue
				}
				have, err := readUsage(ctx, tx, ap, len(ap.Quota.Tiers) > 0, false, time.Now())
				if err != nil {
					return err
				}
				if err := fits(ap, have, u); err != nil {
					return err
				}
			}
		}
		for sign, paths := range map[int64][]string{-1: leave, 1: join} {
			ids, err := idsOfPaths(ctx, tx, paths)
			if err != nil {
				return err
			}
			d := model.Usage{Sandboxes: sign * u.Sandboxes, CPUs: float64(sign) * u.CPUs, MemoryBytes: sign * u.MemoryBytes,
				DiskBytes: sign * u.DiskBytes, Tiers: map[string]int64{}}
			for t, n := range u.Tiers {
				d.Tiers[t] = sign * n
			}
			if err := addUsageTo(ctx, tx, ids, d); err != nil {
				return err
			}
		}
		cond, args := subtreeCond("path", from)
		// Every path in the subtree starts with from; swap that prefix for to.
		if _, err := tx.ExecContext(ctx, `UPDATE projects SET path = ? || substr(path, ?) WHERE `+cond,
			append([]any{to, len(from) + 1}, args...)...); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE projects SET parent_id = ? WHERE id = ?`, np.ID, p.ID)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("move project %s to %s: %w", iam.Display(from), iam.Display(to), err)
	}
	return s.GetProject(ctx, to)
}

// lockTree locks the usage rows of the projects at paths and of their ancestors (PostgreSQL), the
// rows every admission under them locks first: a deletion or move and an admission into the same
// subtree take turns.
func lockTree(ctx context.Context, tx *Tx, paths ...string) error {
	if !tx.pg {
		return nil
	}
	var all []string
	for _, p := range paths {
		all = append(all, iam.Ancestors(p)...)
	}
	ids, err := idsOfPaths(ctx, tx, all)
	if err != nil {
		return err
	}
	return lockUsage(ctx, tx, slices.Sorted(slices.Values(ids)))
}

// insertPrincipal adds a principal in project projectID.
func insertPrincipal(ctx context.Context, tx *Tx, p model.Principal, projectID, createdBy string) error {
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM principals WHERE name = ?`, p.Name).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return errdefs.Conflict("principal %s exists already", p.Name)
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO principals (name, kind, project_id, created_at, created_by) VALUES (?, ?, ?, ?, ?)`,
		p.Name, p.Kind, projectID, time.Now().UnixNano(), createdBy)
	if isUnique(err) {
		return errdefs.Conflict("principal %s exists already", p.Name)
	}
	return err
}

// CreatePrincipal creates a principal in the project at a canonical path.
func (s *Store) CreatePrincipal(ctx context.Context, p model.Principal, path, createdBy string) error {
	err := s.tx(ctx, func(tx *Tx) error {
		pr, err := getProject(ctx, tx, path)
		if err != nil {
			return err
		}
		return insertPrincipal(ctx, tx, p, pr.ID, createdBy)
	})
	if err != nil {
		return fmt.Errorf("create principal %s: %w", p.Name, err)
	}
	return nil
}

// GetPrincipal returns a principal, its project's canonical path in Project.
func (s *Store) GetPrincipal(ctx context.Context, name string) (*model.Principal, error) {
	var p model.Principal
	var created int64
	err := s.rdb.QueryRowContext(ctx, `SELECT pr.name, pr.kind, p.path, pr.created_at, pr.created_by FROM principals pr
		JOIN projects p ON p.id = pr.project_id WHERE pr.name = ?`, name).Scan(&p.Name, &p.Kind, &p.Project, &created, &p.CreatedBy)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.NotFound("principal %s", name)
	}
	if err != nil {
		return nil, fmt.Errorf("get principal %s: %w", name, err)
	}
	p.CreatedAt = unixNano(created)
	return &p, nil
}

// ListPrincipals returns the principals created in under's subtree; Project is canonical.
func (s *Store) ListPrincipals(ctx context.Context, under string) ([]model.Principal, error) {
	cond, args := subtreeCond("p.path", under)
	rows, err := s.rdb.QueryContext(ctx, `SELECT pr.name, pr.kind, p.path, pr.created_at, pr.created_by FROM principals pr
		JOIN projects p ON p.id = pr.project_id WHERE `+cond+` ORDER BY pr.name`, args...)
	if err != nil {
		return nil, fmt.Errorf("list principals: %w", err)
	}
	defer rows.Close()
	out := []model.Principal{}
	for rows.Next() {
		var p model.Principal
		var created int64
		if err := rows.Scan(&p.Name, &p.Kind, &p.Project, &created, &p.CreatedBy); err != nil {
			return nil, err
		}
		p.CreatedAt = unixNano(created)
		out = append(out, p)
	}
	return out, rows.Err()
}

// AddGrant gives principal role on the project at a canonical path (a no-op when it has it).
func (s *Store) AddGrant(ctx context.Context, path, principal, role, createdBy string) error {
	err := s.tx(ctx, func(tx *Tx) error {
		p, err := getProject(ctx, tx, path)
		if err != nil {
			return err
		}
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM principals WHERE name = ?`, principal).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return errdefs.NotFound("principal %s", principal)
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO grants (project_id, principal, role, created_at, created_by) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (principal, project_id, role) DO NOTHING`, p.ID, principal, role, time.Now().UnixNano(), createdBy)
		return err
	})
	if err != nil {
		return fmt.Errorf("grant %s on %s to %s: %w", role, iam.Display(path), principal, err)
	}
	return nil
}

// RemoveGrant removes principal's role (every role when role is empty) on a project.
func (s *Store) RemoveGrant(ctx context.Context, path, principal, role string) error {
	q := `DELETE FROM grants WHERE principal = ? AND project_id = (SELECT id FROM projects WHERE path = ?)`
	args := []any{principal, path}
	if role != "" {
		q += ` AND role = ?`
		args = append(args, role)
	}
	res, err := s.db.ExecContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("revoke grant: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFound("grant of %s on %s", principal, iam.Display(path))
	}
	return nil
}

// ListGrants returns the grants on under's subtree; Project is canonical.
func (s *Store) ListGrants(ctx context.Context, under string) ([]model.Grant, error) {
	cond, args := subtreeCond("p.path", under)
	rows, err := s.rdb.QueryContext(ctx, `SELECT p.path, g.principal, g.role, g.created_at, g.created_by FROM grants g
		JOIN projects p ON p.id = g.project_id WHERE `+cond+` ORDER BY p.path, g.principal, g.role`, args...)
	if err != nil {
		return nil, fmt.Errorf("list grants: %w", err)
	}
	defer rows.Close()
	out := []model.Grant{}
	for rows.Next() {
		var g model.Grant
		var created int64
		if err := rows.Scan(&g.Project, &g.Principal, &g.Role, &created, &g.CreatedBy); err != nil {
			return nil, err
		}
		g.CreatedAt = unixNano(created)
		out = append(out, g)
	}
	return out, rows.Err()
}

// AddAudit appends an entry to the audit log. e.Project is a canonical path; the entry belongs
// to that project's ID (so it follows moves), or, when no project has that path (a refused
// request naming one that does not exist), to fallback's, with the path it named kept as text.
// Control characters in the caller-supplied text are replaced, so a log reader's terminal never
// interprets them.
func (s *Store) AddAudit(ctx context.Context, e model.AuditEntry, fallback string) error {
	return addAudit(ctx, s.db, e, fallback)
}

// AuditWrite is an entry of AddAudits with its fallback project (AddAudit).
type AuditWrite struct {
	Entry    model.AuditEntry
	Fallback string
}

// AddAudits appends entries to the audit log in one transaction, all or none (a batch a cluster's
// edge sent, which it sends again when this fails).
func (s *Store) AddAudits(ctx context.Context, ws []AuditWrite) error {
	return s.tx(ctx, func(tx *Tx) error {
		for _, w := range ws {
			if err := addAudit(ctx, tx, w.Entry, w.Fallback); err != nil {
				return err
			}
		}
		return nil
	})
}

func addAudit(ctx context.Context, q querier, e model.AuditEntry, fallback string) error {
	clean := func(v string) string {
		return strings.Map(func(r rune) rune {
			if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == utf8.RuneError {
				return '?'
			}
			return r
		}, v)
	}
	_, err := q.ExecContext(ctx, `INSERT INTO audit (at, principal, token_id, project_id, project_path, action, target, result, detail)
		VALUES (?, ?, ?, COALESCE((SELECT id FROM projects WHERE path = ?), (SELECT id FROM projects WHERE path = ?), ''), ?, ?, ?, ?, ?)`,
		e.At.UnixNano(), e.Principal, e.Token, e.Project, fallback, clean(e.Project), e.Action, clean(e.Target), e.Result, clean(e.Detail))
	if err != nil {
		return fmt.Errorf("write audit entry: %w", err)
	}
	return nil
}

// ListAudit returns the entries of a canonical project's subtree, newest first, each with the
// project path it had when it was written. Entries of deleted projects belong to the deleted
// subtree's parent.
func (s *Store) ListAudit(ctx context.Context, project string, q model.AuditQuery) ([]model.AuditEntry, error) {
	cur, args := subtreeCond("p.path", project)
	where := `a.project_id IN (SELECT p.id FROM projects p WHERE ` + cur + `)`
	if q.Action != "" {
		if strings.HasSuffix(q.Action, ".") {
			where += ` AND substr(a.action, 1, ?) = ?`
			args = append(args, len(q.Action), q.Action)
		} else {
			where += ` AND a.action = ?`
			args = append(args, q.Action)
		}
	}
	if q.Before > 0 {
		where += ` AND a.id < ?`
		args = append(args, q.Before)
	}
	limit := q.Limit
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT a.id, a.at, a.principal, a.token_id, a.project_path, a.action, a.target, a.result, a.detail
		FROM audit a WHERE `+where+` ORDER BY a.id DESC LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	defer rows.Close()
	out := []model.AuditEntry{}
	for rows.Next() {
		var e model.AuditEntry
		var at int64
		if err := rows.Scan(&e.ID, &at, &e.Principal, &e.Token, &e.Project, &e.Action, &e.Target, &e.Result, &e.Detail); err != nil {
			return nil, err
		}
		e.At = unixNano(at)
		e.Project = iam.Display(e.Project)
		out = append(out, e)
	}
	return out, rows.Err()
}

// PruneAudit removes audit entries older than before and returns how many.
func (s *Store) PruneAudit(ctx context.Context, before time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM audit WHERE at < ?`, before.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("prune audit: %w", err)
	}
	return res.RowsAffected()
}

// SandboxProject returns the canonical path of a sandbox's project.
func (s *Store) SandboxProject(ctx context.Context, id string) (string, error) {
	var p string
	err := s.rdb.QueryRowContext(ctx, `SELECT COALESCE(p.path, '') FROM sandboxes s LEFT JOIN projects p ON p.id = s.project_id WHERE s.id = ?`, id).Scan(&p)
	if errors.Is(err, sql.ErrNoRows) {
		return "", errdefs.UnknownSandbox(id, "")
	}
	if err != nil {
		return "", fmt.Errorf("project of sandbox %s: %w", id, err)
	}
	return p, nil
}
