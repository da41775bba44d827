package store

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazyregexp"
)

// The edge role: what a cluster's edges may do in the shared PostgreSQL store, as a role of its
// own (`corral server edge-role`, handed to joining edges with `corral server --edge-store`).
// Since the servers authenticate every request and serve identity themselves (internal/nodeproto),
// an edge needs nothing of identity: the role cannot read or write tokens, principals or grants,
// cannot change projects or quotas (it reads projects: admission checks quotas against them), and
// has no privilege on the settings: an edge has its instance name from its registration and the
// service catalogue from the servers' configuration (the node channel), so it sees neither the
// cluster CA's key, the join token nor the E2B secrets. Webhooks are delivered by the servers, so
// an edge cannot read their secrets or their delivery log. The event stream is served by the
// servers and recorded by them too: an edge sends its events over the node channel, where the
// servers refuse any that speak for another node, so the role has no privilege on it; so do the
// sandboxes' usage rows (the report's), which the servers write from the edges' activity batches
// and the sandboxes' own records; and so do the trajectories, which the servers write and read
// for an edge's own sandboxes only. The audit log is served and written by the servers: an edge
// sends the entries of the requests it serves over the node channel, where the servers write
// them as the callers they sealed for it, so it can neither read the log, erase what it did nor
// write an entry in another principal's name. New sandboxes are admitted by the servers
// (the node channel: the epoch, the quotas, the creation rate, the volumes and the idempotency
// key in one transaction, for records of the edge's own node only), and their records written
// by the servers from then on, so an edge reads the sandboxes' records, the quota usage and the
// volumes' attachments and changes none of them, and has no privilege on the idempotency keys
// (the principals' create requests). A stolen edge's credentials then mint no token, forge no
// server certificate, sign no webhook delivery, cover no tracks, add or rewrite no sandbox
// record and take no project's quota with sandboxes. Volumes are created and deleted by the
// servers too, and their versions and copies recorded by them (the node channel), so an edge only
// reads the volumes and the quota usage: no write of its moves a project's quota. The catalogue
// is the servers' too: an edge publishes the layer versions it imports, snapshots and builds,
// changes and deletes them, and saves its builds' environments through the node channel, for the
// caller of the request behind each, so it only reads layers, environments and fncall
// environments (it resolves builds' FROM and what its own API serves from them), and no stolen
// edge repoints a version every tenant creates from. The role writes nothing, and a table a
// later release adds gets no privilege until it is listed here.

// edgeDenied lists the tables an edge role gets no privilege on (as any table not listed in
// edgeReadOnly).
var edgeDenied = []string{"api_tokens", "principals", "grants", "webhooks", "webhook_deliveries", "events", "servers", "sandbox_usage", "settings", "trajectory", "idempotency", "audit"}

// edgeReadOnly lists the tables an edge role may only read: projects; the catalogue (layer
// versions, tags, environments and fncall environments: the servers publish, move and save
// them; a stolen edge cannot point a version or tag every tenant creates from at a blob of its
// choosing); the nodes (registration, heartbeats and the epoch's checks are the servers'); the
// sandboxes' records, the volumes, their attachments and copies, and the quota usage (admission,
// every record write and the volumes' create, delete, versions and copies are the servers').
var edgeReadOnly = []string{"projects", "schema_migrations", "layers", "layer_tags", "environments", "fncall_envs", "nodes", "sandboxes",
	"volumes", "volume_attachments", "volume_copies", "project_usage", "project_tier_usage"}

// CatalogSetting is the setting that keeps the network service catalogue saved through the API
// (PUT /v1/network/services): the servers write it and send it to every edge.
const CatalogSetting = "service_catalog"

var roleRE = lazyregexp.New(`^[a-z_][a-z0-9_]{0,62}$`)

// EdgeRoleSQL returns the statements that give role (which must exist) the edge's privileges on
// this store's tables, and no more: everything it held before on them is revoked first. It
// needs a PostgreSQL store, opened as the tables' owner.
func (s *Store) EdgeRoleSQL(ctx context.Context, role string) ([]string, error) {
	if !s.db.pg {
		return nil, errdefs.Invalid("store", "an edge role is for a cluster's PostgreSQL store; this one is SQLite")
	}
	if !roleRE.MatchString(role) {
		return nil, errdefs.Invalid("role", "%q is not a role name (lower-case letters, digits and _, at most 63, not starting with a digit)", role)
	}
	var schema string
	if err := s.db.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return nil, fmt.Errorf("edge role: the store's schema: %w", err)
	}
	rows, err := s.db.QueryContext(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY table_name`)
	if err != nil {
		return nil, fmt.Errorf("edge role: list the store's tables: %w", err)
	}
	defer rows.Close()
	var tables []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, err
		}
		tables = append(tables, t)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if !slices.Contains(tables, "settings") {
		return nil, errdefs.Invalid("store", "the store has no Corral tables yet: start a corral server on it first (it creates them)")
	}
	q := func(id string) string { return `"` + id + `"` }
	stmts := []string{
		fmt.Sprintf(`GRANT USAGE ON SCHEMA %s TO %s`, q(schema), role),
		// The role inserts nothing, so it draws no sequence's numbers (releases before granted it).
		fmt.Sprintf(`REVOKE ALL ON ALL SEQUENCES IN SCHEMA %s FROM %s`, q(schema), role),
	}
	for _, t := range tables {
		stmts = append(stmts, fmt.Sprintf(`REVOKE ALL ON %s FROM %s`, q(t), role))
		if slices.Contains(edgeReadOnly, t) {
			stmts = append(stmts, fmt.Sprintf(`GRANT SELECT ON %s TO %s`, q(t), role))
		}
	}
	// Releases before the node channel's configuration let the role see a few settings through
	// row-level security policies; they go (the table's security stays on: other roles' policies
	// may still need it until edge-role runs for them too).
	policy := "corral_edge_settings_" + role
	stmts = append(stmts,
		fmt.Sprintf(`DROP POLICY IF EXISTS %s ON settings`, policy),
		fmt.Sprintf(`DROP POLICY IF EXISTS %s_read ON settings`, policy),
	)
	return stmts, nil
}

// ApplyEdgeRole creates role when it does not exist (LOGIN, with password when not empty) and
// gives it the edge's privileges (EdgeRoleSQL), in one transaction. It returns the statements
// it ran, the password left out.
func (s *Store) ApplyEdgeRole(ctx context.Context, role, password string) ([]string, error) {
	stmts, err := s.EdgeRoleSQL(ctx, role)
	if err != nil {
		return nil, err
	}
	var exists bool
	if err := s.db.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = ?)`, role).Scan(&exists); err != nil {
		return nil, fmt.Errorf("edge role: look role %s up: %w", role, err)
	}
	run, shown := stmts, stmts
	if !exists {
		create := fmt.Sprintf(`CREATE ROLE %s LOGIN`, role)
		show := create
		if password != "" {
			create += ` PASSWORD '` + strings.ReplaceAll(password, `'`, `''`) + `'`
			show += ` PASSWORD '…'`
		}
		run, shown = append([]string{create}, stmts...), append([]string{show}, stmts...)
	}
	err = s.tx(ctx, func(tx *Tx) error {
		for _, st := range run {
			if _, err := tx.ExecContext(ctx, st); err != nil {
				return fmt.Errorf("%s: %w", strings.SplitN(st, " PASSWORD", 2)[0], err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("edge role %s: %w", role, err)
	}
	return shown, nil
}
