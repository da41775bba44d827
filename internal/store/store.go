// Package store keeps Corral's durable state: sandboxes, layers, environments, the project tree,
// principals, grants, tokens, quotas and their usage, the audit log and trajectories.
//
// One schema and one body of SQL back two drivers (dialect.go): SQLite (modernc.org/sqlite, pure
// Go, WAL), the embedded default for one machine, and PostgreSQL (jackc/pgx) for several API
// replicas on one database. The same tests run against both.
//
// Concurrency: a Store is safe for concurrent use. On SQLite one connection writes (transactions
// are BEGIN IMMEDIATE, so they run one at a time) and a few read-only connections share WAL
// snapshots; on PostgreSQL transactions run side by side and lock the rows they read to change.
package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/lazyregexp"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// Store is the durable state of one Corral installation.
type Store struct {
	db  *conn // SQLite: the one writer connection (writes and transactions); PostgreSQL: the pool
	rdb *conn // SQLite: reader connections for single reads outside transactions, concurrent with the writer (WAL); PostgreSQL: db
	// onFull, set once before use (OnFull), frees disk for a write that failed on a full disk.
	onFull func() bool
	// trajectoryMax bounds each sandbox's stored trajectory (SetTrajectoryLimit).
	trajectoryMax int64
	// endedFilled is set once ForgetEnded filled in ended_ns of the records older than it.
	endedFilled atomic.Bool
}

// DefaultTrajectoryBytes bounds each sandbox's stored trajectory unless SetTrajectoryLimit says.
const DefaultTrajectoryBytes = 64 << 20

// SetTrajectoryLimit bounds each sandbox's stored trajectory to n bytes (0: the default): past
// it, the outputs of its oldest finished steps are dropped (OutputDropped), their steps and
// step IDs kept. Call it before the store is used.
func (s *Store) SetTrajectoryLimit(n int64) { s.trajectoryMax = n }

// OnFull sets f, called when a transaction fails because the database's disk is full; when f
// reports that it freed space (a reserve file it kept for this), the transaction runs once more.
// Call it before the store is used.
func (s *Store) OnFull(f func() bool) { s.onFull = f }

// Sandbox is a sandbox's durable record: its API view plus what the edge needs to rebuild it.
type Sandbox struct {
	model.Sandbox
	// Lower lists the layer digests of the rootfs, bottom (base) first.
	Lower []string `json:"lower"`
	// NetSlot is the sandbox's network slot (internal/egress), nil without networking.
	NetSlot *int `json:"net_slot,omitempty"`
	// ProjectID is the project the sandbox lives in (Project holds its path, filled on reads).
	ProjectID string `json:"project_id,omitempty"`
	// VolumeIDs are the IDs of the volumes in Volumes, in the same order.
	VolumeIDs []string `json:"volume_ids,omitempty"`
	// Stopping records, before its teardown starts, how a live sandbox is being ended (a delete,
	// a TTL, ...), so a teardown cut short by a crash is finished with that outcome at the next
	// start instead of being taken for a sandbox that died.
	Stopping *StopIntent `json:"stopping,omitempty"`
}

// StopIntent is the outcome a sandbox's teardown will record.
type StopIntent struct {
	State  string    `json:"state"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// migrations are applied in order, each once; never edit one that has shipped, add another.
var migrations = []string{
	`CREATE TABLE sandboxes (
		id TEXT PRIMARY KEY,
		node TEXT NOT NULL,
		state TEXT NOT NULL,
		expires_at INTEGER NOT NULL,
		doc TEXT NOT NULL
	);
	CREATE INDEX sandboxes_state ON sandboxes(state);
	CREATE TABLE layers (
		name TEXT NOT NULL,
		version TEXT NOT NULL,
		kind TEXT NOT NULL,
		digest TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		doc TEXT NOT NULL,
		PRIMARY KEY (name, version)
	);
	CREATE INDEX layers_digest ON layers(digest);
	CREATE TABLE tokens (
		hash TEXT PRIMARY KEY,
		principal TEXT NOT NULL,
		created_at INTEGER NOT NULL
	);`,
	`CREATE TABLE trajectory (
		sandbox_id TEXT NOT NULL,
		seq INTEGER NOT NULL,
		step_id TEXT NOT NULL DEFAULT '',
		state TEXT NOT NULL,
		doc TEXT NOT NULL,
		PRIMARY KEY (sandbox_id, seq)
	);
	CREATE UNIQUE INDEX trajectory_step ON trajectory(sandbox_id, step_id) WHERE step_id != '';`,
	`CREATE TABLE environments (
		name TEXT PRIMARY KEY,
		created_at INTEGER NOT NULL,
		doc TEXT NOT NULL
	);
	CREATE TABLE layer_tags (
		name TEXT NOT NULL,
		tag TEXT NOT NULL,
		version TEXT NOT NULL,
		updated_at INTEGER NOT NULL,
		PRIMARY KEY (name, tag)
	);`,
	`CREATE TABLE settings (
		key TEXT PRIMARY KEY,
		doc TEXT NOT NULL
	);`,
	`CREATE TABLE fncall_envs (
		name TEXT PRIMARY KEY,
		created_at INTEGER NOT NULL,
		doc TEXT NOT NULL
	);`,
	// 7: identity. Every object lives in a project; the root project and principal exist from the
	// start, and tokens of earlier versions become root tokens with every permission.
	`CREATE TABLE projects (
		id TEXT PRIMARY KEY,
		path TEXT NOT NULL UNIQUE,
		parent_id TEXT,
		created_at INTEGER NOT NULL,
		created_by TEXT NOT NULL,
		quota TEXT NOT NULL DEFAULT '{}'
	);
	CREATE INDEX projects_parent ON projects(parent_id);
	INSERT INTO projects (id, path, parent_id, created_at, created_by, quota) VALUES ('prj-root', '', NULL, 0, 'root', '{}');
	CREATE TABLE principals (
		name TEXT PRIMARY KEY,
		kind TEXT NOT NULL,
		project_id TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		created_by TEXT NOT NULL
	);
	CREATE INDEX principals_project ON principals(project_id);
	INSERT INTO principals (name, kind, project_id, created_at, created_by) VALUES ('root', 'user', 'prj-root', 0, '');
	CREATE TABLE grants (
		project_id TEXT NOT NULL,
		principal TEXT NOT NULL,
		role TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		created_by TEXT NOT NULL,
		PRIMARY KEY (principal, project_id, role)
	);
	CREATE INDEX grants_project ON grants(project_id);
	INSERT INTO grants (project_id, principal, role, created_at, created_by) VALUES ('prj-root', 'root', 'owner', 0, '');
	CREATE TABLE api_tokens (
		id TEXT PRIMARY KEY,
		hash TEXT NOT NULL UNIQUE,
		principal TEXT NOT NULL,
		project_id TEXT NOT NULL,
		perms INTEGER NOT NULL,
		role TEXT NOT NULL,
		parent TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		expires_at INTEGER NOT NULL,
		revoked_at INTEGER NOT NULL
	);
	CREATE INDEX api_tokens_parent ON api_tokens(parent);
	CREATE INDEX api_tokens_principal ON api_tokens(principal);
	CREATE INDEX api_tokens_project ON api_tokens(project_id);
	INSERT INTO api_tokens (id, hash, principal, project_id, perms, role, parent, created_at, expires_at, revoked_at)
		SELECT 'tok-' || substr(hash, 1, 16), hash, 'root', 'prj-root', 4095, 'owner', '', created_at, 0, 0 FROM tokens;
	DROP TABLE tokens;
	CREATE TABLE audit (
		id INTEGER PRIMARY KEY,
		at INTEGER NOT NULL,
		principal TEXT NOT NULL,
		token_id TEXT NOT NULL,
		project_id TEXT NOT NULL,
		project_path TEXT NOT NULL,
		action TEXT NOT NULL,
		target TEXT NOT NULL,
		result TEXT NOT NULL,
		detail TEXT NOT NULL
	);
	CREATE INDEX audit_project ON audit(project_id, id);
	CREATE INDEX audit_at ON audit(at);
	ALTER TABLE sandboxes ADD COLUMN project_id TEXT NOT NULL DEFAULT 'prj-root';
	ALTER TABLE sandboxes ADD COLUMN tier TEXT NOT NULL DEFAULT 'container';
	ALTER TABLE sandboxes ADD COLUMN cpus REAL NOT NULL DEFAULT 0;
	ALTER TABLE sandboxes ADD COLUMN memory_bytes INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sandboxes ADD COLUMN disk_bytes INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sandboxes ADD COLUMN created_ns INTEGER NOT NULL DEFAULT 0;
	CREATE INDEX sandboxes_project ON sandboxes(project_id, state);
	CREATE INDEX sandboxes_created ON sandboxes(created_ns);
	ALTER TABLE layers ADD COLUMN project_id TEXT NOT NULL DEFAULT 'prj-root';
	ALTER TABLE layers ADD COLUMN private INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE environments ADD COLUMN project_id TEXT NOT NULL DEFAULT 'prj-root';
	ALTER TABLE fncall_envs ADD COLUMN project_id TEXT NOT NULL DEFAULT 'prj-root';`,
	// 8: per-project subtree usage, kept in step with the sandbox rows (putSandbox) so admission
	// reads one row per limited ancestor instead of summing the subtree; the creation-rate bucket
	// of projects that limit it. Filled by RecountUsage, which every start runs.
	`CREATE TABLE project_usage (
		project_id TEXT PRIMARY KEY,
		sandboxes INTEGER NOT NULL DEFAULT 0,
		cpus REAL NOT NULL DEFAULT 0,
		memory_bytes INTEGER NOT NULL DEFAULT 0,
		disk_bytes INTEGER NOT NULL DEFAULT 0,
		bucket REAL NOT NULL DEFAULT 0,
		bucket_ns INTEGER NOT NULL DEFAULT 0
	);
	CREATE TABLE project_tier_usage (
		project_id TEXT NOT NULL,
		tier TEXT NOT NULL,
		sandboxes INTEGER NOT NULL,
		PRIMARY KEY (project_id, tier)
	);
	INSERT INTO project_usage (project_id) SELECT id FROM projects;
	CREATE INDEX sandboxes_project_created ON sandboxes(project_id, created_ns);`,
	// 9: idempotency keys of creates, so a client's retry (through any API replica) never makes a
	// second sandbox.
	`CREATE TABLE idempotency (
		principal TEXT NOT NULL,
		idem_key TEXT NOT NULL,
		request_hash TEXT NOT NULL,
		sandbox_id TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		PRIMARY KEY (principal, idem_key)
	);
	CREATE INDEX idempotency_created ON idempotency(created_at);`,
	// 10: nodes (cluster mode): one leased row per edge, its epoch the fencing token.
	`CREATE TABLE nodes (
		name TEXT PRIMARY KEY,
		url TEXT NOT NULL,
		epoch INTEGER NOT NULL,
		state TEXT NOT NULL,
		lease_expires_at INTEGER NOT NULL,
		heartbeat_at INTEGER NOT NULL,
		registered_at INTEGER NOT NULL,
		doc TEXT NOT NULL
	);
	CREATE INDEX sandboxes_node ON sandboxes(node, state);`,
	// 11: project placement (cluster mode): the node groups a project's sandboxes are pinned to
	// or kept off.
	`ALTER TABLE projects ADD COLUMN placement TEXT NOT NULL DEFAULT '{}';`,
	// 12: layer visibility (issue 22): public shows a layer to every project. Existing layers
	// keep their project's subtree, which for the root project's means the root alone: the
	// operator publishes (corral layer publish) the base images meant for tenants.
	`ALTER TABLE layers ADD COLUMN public INTEGER NOT NULL DEFAULT 0;`,
	// 13: a trajectory step run exclusive (corral exec --exclusive: every other process of the
	// sandbox stopped while it ran), kept as a column so the mark does not depend on the document.
	`ALTER TABLE trajectory ADD COLUMN exclusive INTEGER NOT NULL DEFAULT 0;`,
	// 14: trajectory storage bounded per sandbox (issue 23): each step's stored size, whether its
	// output was dropped to keep the bound, and each sandbox's total (charged to its project's
	// disk usage while it is live).
	`ALTER TABLE trajectory ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE trajectory ADD COLUMN output_dropped INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sandboxes ADD COLUMN trajectory_bytes INTEGER NOT NULL DEFAULT 0;
	UPDATE trajectory SET bytes = LENGTH(doc);
	UPDATE sandboxes SET trajectory_bytes = (SELECT COALESCE(SUM(bytes), 0) FROM trajectory WHERE sandbox_id = sandboxes.id);`,
	// 15: volumes (issue 27): persistent filesystems of a project, charged to its disk quota, and
	// their attachments to live sandboxes (volumes.go).
	`CREATE TABLE volumes (
		id TEXT PRIMARY KEY,
		project_id TEXT NOT NULL,
		name TEXT NOT NULL,
		size_bytes INTEGER NOT NULL,
		node TEXT NOT NULL,
		state TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		UNIQUE (project_id, name)
	);
	CREATE TABLE volume_attachments (
		volume_id TEXT NOT NULL,
		sandbox_id TEXT NOT NULL,
		read_only INTEGER NOT NULL,
		PRIMARY KEY (volume_id, sandbox_id)
	);
	CREATE INDEX volume_attachments_sandbox ON volume_attachments(sandbox_id);`,
	// 16: observability (issue 28): the event stream's durable copy, webhooks and their
	// delivery log, and one usage row per sandbox for the report, kept after the sandbox's
	// record is forgotten.
	`CREATE TABLE events (
		id TEXT PRIMARY KEY,
		at INTEGER NOT NULL,
		type TEXT NOT NULL,
		project_path TEXT NOT NULL,
		doc TEXT NOT NULL
	);
	CREATE INDEX events_at ON events(at);
	CREATE TABLE webhooks (
		id TEXT PRIMARY KEY,
		project_id TEXT NOT NULL,
		url TEXT NOT NULL,
		events TEXT NOT NULL,
		secret TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		created_by TEXT NOT NULL
	);
	CREATE INDEX webhooks_project ON webhooks(project_id);
	CREATE TABLE webhook_deliveries (
		id INTEGER PRIMARY KEY,
		webhook_id TEXT NOT NULL,
		at INTEGER NOT NULL,
		doc TEXT NOT NULL
	);
	CREATE INDEX webhook_deliveries_hook ON webhook_deliveries(webhook_id, id);
	CREATE TABLE sandbox_usage (
		id TEXT PRIMARY KEY,
		project_path TEXT NOT NULL,
		node TEXT NOT NULL,
		tier TEXT NOT NULL,
		environment TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		first_exec_at INTEGER NOT NULL DEFAULT 0,
		ended_at INTEGER NOT NULL DEFAULT 0,
		reason TEXT NOT NULL DEFAULT '',
		ttl_extended INTEGER NOT NULL DEFAULT 0,
		actions INTEGER NOT NULL DEFAULT 0,
		blocked INTEGER NOT NULL DEFAULT 0,
		tokens INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX sandbox_usage_created ON sandbox_usage(created_at);`,
	// 17: warm pools (issue 24): an environment's pool size, as a column so that the edges
	// find the environments with pools without reading every document.
	`ALTER TABLE environments ADD COLUMN warm INTEGER NOT NULL DEFAULT 0;`,
	// 18: volumes in a cluster (issue 27): the version a volume's image was last uploaded as
	// (0: never written; the first attach makes it empty) and that image's digest, and which
	// node caches which version (placement prefers a node holding the current one).
	`ALTER TABLE volumes ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE volumes ADD COLUMN digest TEXT NOT NULL DEFAULT '';
	CREATE TABLE volume_copies (
		volume_id TEXT NOT NULL,
		node TEXT NOT NULL,
		version INTEGER NOT NULL,
		PRIMARY KEY (volume_id, node)
	);`,
	// 19: when a sandbox ended, as a column, so that ended records past their retention are
	// found without reading every document (ForgetEnded; records that ended before it are
	// filled in there).
	`ALTER TABLE sandboxes ADD COLUMN ended_ns INTEGER NOT NULL DEFAULT 0;
	CREATE INDEX sandboxes_ended ON sandboxes(ended_ns);`,
	// 20: the cluster's server replicas and where edges reach their node channel
	// (AnnounceServer); a column of the nodes no one writes, whose UPDATE privilege alone lets
	// the edges' role lock a node row to check its epoch (checkEpoch) while it may write nothing
	// of a node (EdgeRoleSQL).
	`CREATE TABLE servers (
		name TEXT PRIMARY KEY,
		node_url TEXT NOT NULL,
		seen_ns BIGINT NOT NULL
	);
	ALTER TABLE nodes ADD COLUMN lock_only INTEGER NOT NULL DEFAULT 0;`,
	// 21: a live sandbox's last activity as the servers record it from its edge's batches
	// (RecordActivity), beside the document, which a record read overlays (decodeSandbox):
	// a column update races no write of the document.
	`ALTER TABLE sandboxes ADD COLUMN activity_ns BIGINT NOT NULL DEFAULT 0;`,
	// 22: the figures of each node's warm pools, by environment, as its last heartbeat reported
	// them (Heartbeat, WarmFigures).
	`ALTER TABLE nodes ADD COLUMN warm TEXT NOT NULL DEFAULT '{}';`,
}

// Open opens the store at dsn and applies migrations: a PostgreSQL URL (postgres://USER@HOST:PORT/DB?
// sslmode=disable, for several API replicas on one database), or else the path of a SQLite file,
// created if needed (the embedded default for one machine).
func Open(ctx context.Context, dsn string) (*Store, error) {
	if IsPostgres(dsn) {
		return openPostgres(ctx, dsn)
	}
	if err := os.MkdirAll(filepath.Dir(dsn), 0o700); err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	url := "file:" + dsn + "?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)" +
		"&_pragma=busy_timeout(5000)&_pragma=foreign_keys(ON)&_txlock=immediate"
	db, err := sql.Open("sqlite", url)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", dsn, err)
	}
	// One connection: SQLite has one writer anyway, and this keeps transactions free of SQLITE_BUSY.
	db.SetMaxOpenConns(1)
	s := &Store{db: &conn{DB: db}}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	// Readers see the last committed state through WAL snapshots without waiting for the writer.
	rdb, err := sql.Open("sqlite", url+"&_pragma=query_only(1)")
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", dsn, err)
	}
	rdb.SetMaxOpenConns(4)
	s.rdb = &conn{DB: rdb, stmts: &stmtCache{db: rdb}}
	return s, nil
}

// pgIdleInTransaction is how long PostgreSQL keeps a session of Corral's that sits in a
// transaction without sending its next statement before it ends the session and so releases its
// row locks (idle_in_transaction_session_timeout; a DSN may set its own). Corral's transactions
// are the store's own statements, sent one after another: a session idle in one that long belongs
// to a process that is gone or cut off, say an edge partitioned between its node row's SELECT
// FOR UPDATE and the COMMIT. Without the bound, PostgreSQL keeps that lock until TCP keepalive
// notices the dead peer (hours by default), and every server's sweep of lost nodes waits on it,
// so the partitioned node is never declared lost (seen in TestCluster's partition step).
const pgIdleInTransaction = "5s"

// openPostgres opens the store on a PostgreSQL database: one pool for reads and writes, since
// PostgreSQL runs transactions side by side (those that must not, lock rows: forUpdate).
// maxPostgresConns bounds a store's PostgreSQL connections.
const maxPostgresConns = 16

func openPostgres(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	if _, ok := cfg.RuntimeParams["idle_in_transaction_session_timeout"]; !ok {
		cfg.RuntimeParams["idle_in_transaction_session_timeout"] = pgIdleInTransaction
	}
	db := stdlib.OpenDB(*cfg)
	// As many kept idle as may be open: database/sql keeps 2 by default, so every burst past
	// 2 concurrent statements (a replica admitting for several edges at once) closed the
	// connections it opened and paid a new PostgreSQL backend for each next time.
	db.SetMaxOpenConns(maxPostgresConns)
	db.SetMaxIdleConns(maxPostgresConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store: connect to PostgreSQL: %w", err)
	}
	c := &conn{DB: db, pg: true}
	s := &Store{db: c, rdb: c}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error {
	if s.rdb != s.db {
		s.rdb.stmts.close()
		s.rdb.Close()
	}
	return s.db.Close()
}

// migrate applies the migrations this binary has and the database lacks, each in its own
// transaction. On PostgreSQL an advisory lock makes replicas starting together take turns.
func (s *Store) migrate(ctx context.Context) error {
	if err := s.checkOwnDatabase(ctx); err != nil {
		return err
	}
	// A schema already at this binary's version needs no DDL: a role that may not create
	// tables (a cluster edge's, EdgeRoleSQL) opens it.
	var have int
	if err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&have); err == nil && have == len(migrations) {
		return nil
	}
	if _, err := s.db.ExecContext(ctx, migrateDDL(`CREATE TABLE IF NOT EXISTS schema_migrations (
		version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)`, s.db.pg)); err != nil && !(s.db.pg && isUnique(err)) {
		return fmt.Errorf("migrate store: %w", err)
	}
	for {
		done := false
		var have int
		err := s.tx(ctx, func(tx *Tx) error {
			if tx.pg {
				if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(7070)`); err != nil {
					return err
				}
			}
			if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&have); err != nil {
				return err
			}
			if have > len(migrations) {
				return fmt.Errorf("database schema %d is newer than this binary's %d", have, len(migrations))
			}
			if have == len(migrations) {
				done = true
				return nil
			}
			if _, err := tx.ExecContext(ctx, migrateDDL(migrations[have], tx.pg)); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`, have+1, time.Now().UnixNano())
			return err
		})
		if err != nil {
			return fmt.Errorf("migrate store to version %d: %w", have+1, err)
		}
		if done {
			return nil
		}
	}
}

// checkOwnDatabase refuses a database that holds tables and not Corral's: another application's
// (a --store that names the wrong database), which Corral must neither add tables to nor read as
// its own. An empty database, or one Corral made, passes.
func (s *Store) checkOwnDatabase(ctx context.Context) error {
	q := `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\_%' ESCAPE '\'`
	if s.db.pg {
		q = `SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()`
	}
	rows, err := s.db.QueryContext(ctx, q)
	if err != nil {
		return fmt.Errorf("open store: list its tables: %w", err)
	}
	var names []string
	ours := false
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return fmt.Errorf("open store: list its tables: %w", err)
		}
		names = append(names, n)
		ours = ours || n == "sandboxes"
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("open store: list its tables: %w", err)
	}
	if ours || len(names) == 0 {
		return nil
	}
	// Only schema_migrations: Corral's first start stopped before its first migration, unless the
	// table is another tool's (golang-migrate, Rails), which lacks applied_at.
	if len(names) == 1 && names[0] == "schema_migrations" {
		if _, err := s.db.ExecContext(ctx, `SELECT version, applied_at FROM schema_migrations WHERE 1 = 0`); err == nil {
			return nil
		}
	}
	sort.Strings(names)
	if len(names) > 5 {
		names = append(names[:5], "...")
	}
	return fmt.Errorf("the database holds tables that are not Corral's (%s): it belongs to another application; "+
		"give --store an empty database or the one Corral made; nothing was changed: %w", strings.Join(names, ", "), errdefs.ErrInvalid)
}

// tx runs fn in a transaction, committing when it returns nil. On PostgreSQL a transaction that
// lost a race (serialisation failure, deadlock) runs again.
//
// A transaction that fails on a broken connection before its commit rolled back with the
// connection, so it runs again on another for up to readRetryFor; one whose commit failed that way
// may or may not have been applied, so it is not rerun: both end as ErrUnavailable.
func (s *Store) tx(ctx context.Context, fn func(*Tx) error) error {
	deadline := time.Now().Add(readRetryFor)
	freed := false
	for attempt := 1; ; attempt++ {
		committing, err := s.tx1(ctx, fn)
		var wait time.Duration
		switch {
		case err == nil:
			return nil
		case diskFull(err) && !freed && s.onFull != nil:
			// SQLite rolls a transaction back when it cannot write it; PostgreSQL never
			// commits one that failed with disk_full.
			if freed = s.onFull(); freed {
				continue
			}
			return err
		case transient(err) && committing:
			return errdefs.RetryableCause(fmt.Errorf("the store's connection broke during a commit, which may or may not have been applied; retry with an idempotency key, or check: %w", errdefs.ErrUnavailable), err, time.Second)
		case transient(err):
			wait = min(time.Duration(attempt*attempt)*25*time.Millisecond, time.Second)
			if time.Now().Add(wait).After(deadline) {
				return unavailable(err)
			}
		case retryable(err) && attempt < txRetries:
			wait = backoff(attempt)
		default:
			return err
		}
		select {
		case <-ctx.Done():
			return unavailable(err)
		case <-time.After(wait):
		}
	}
}

// tx1 runs fn in one transaction; committing is true when it got as far as the commit.
func (s *Store) tx1(ctx context.Context, fn func(*Tx) error) (committing bool, err error) {
	stx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, err
	}
	tx := &Tx{Tx: stx, pg: s.db.pg}
	if err := fn(tx); err != nil {
		stx.Rollback()
		return false, err
	}
	return true, stx.Commit()
}

// PutSandbox inserts or replaces a sandbox record. New sandboxes go through AdmitSandbox.
func (s *Store) PutSandbox(ctx context.Context, sb *Sandbox) error {
	return s.tx(ctx, func(tx *Tx) error { return putSandbox(ctx, tx, sb) })
}

// PutNodeSandbox rewrites the record of one of node's sandboxes, as node's incarnation epoch
// wrote it (a cluster's edge, through the servers), in one transaction with the epoch's check
// (ErrFenced when it was fenced off). The record must exist (admission wrote it) and be node's.
// What admission decided and what quota is counted by is kept as the store has it, whatever the
// edge sent: project, tier, limits, node, create time and volumes (so no write moves a sandbox's
// usage to another project or frees quota it holds). A sandbox that ended or is being deleted
// (its quota released) never becomes live again (ErrConflict).
func (s *Store) PutNodeSandbox(ctx context.Context, node string, epoch int64, sb *Sandbox) error {
	err := s.tx(ctx, func(tx *Tx) error {
		if err := shareEpoch(ctx, tx, node, epoch); err != nil {
			return err
		}
		old, err := readStoredRow(ctx, tx, sb.ID, forUpdate(tx), true)
		switch {
		case err != nil:
			return err
		case !old.found:
			return errdefs.NotFound("sandbox %s (a record is written by its admission first)", sb.ID)
		case old.node != node:
			return fmt.Errorf("sandbox %s is node %s's, not %s's: %w", sb.ID, old.node, node, errdefs.ErrDenied)
		case !slices.Contains(liveStates, old.state) && (slices.Contains(liveStates, sb.State) || (sb.State == model.StateDeleting && old.state != model.StateDeleting)):
			// Deleting released the quota; stopped and failed are ends.
			return errdefs.Conflict("sandbox %s is %s: it cannot become %s again", sb.ID, old.state, sb.State)
		}
		var was Sandbox
		if err := json.Unmarshal([]byte(old.doc), &was); err != nil {
			return fmt.Errorf("decode the record of %s: %w", sb.ID, err)
		}
		sb.ProjectID, sb.Tier, sb.Limits, sb.Node, sb.CreatedAt = old.usage.project, was.Tier, was.Limits, old.node, was.CreatedAt
		sb.VolumeIDs, sb.Volumes = was.VolumeIDs, was.Volumes
		return putSandboxOver(ctx, tx, sb, old)
	})
	if err != nil {
		return fmt.Errorf("record sandbox %s of node %s: %w", sb.ID, node, err)
	}
	return nil
}

// storedRow is a sandbox's row as stored, as far as a write of its record needs it.
type storedRow struct {
	found      bool
	doc, node  string
	state      string
	usage      usageRow // what it counts while live, its stored trajectory included
	trajectory int64    // its stored trajectory, charged to its project's disk while it is live
}

// readStoredRow reads the row of sandbox id, with lock (forUpdate, or ""), and its document
// when withDoc (a plain write needs only the columns).
func readStoredRow(ctx context.Context, q querier, id, lock string, withDoc bool) (storedRow, error) {
	var r storedRow
	doc := `''`
	if withDoc {
		doc = `doc`
	}
	err := q.QueryRowContext(ctx, `SELECT `+doc+`, node, state, project_id, tier, cpus, memory_bytes, disk_bytes, trajectory_bytes FROM sandboxes WHERE id = ?`+lock, id).
		Scan(&r.doc, &r.node, &r.state, &r.usage.project, &r.usage.tier, &r.usage.cpus, &r.usage.memory, &r.usage.disk, &r.trajectory)
	if errors.Is(err, sql.ErrNoRows) {
		return r, nil
	}
	r.found = err == nil
	r.usage.disk += r.trajectory
	return r, err
}

// putSandbox writes a sandbox row and moves its share of the usage counters when it becomes live,
// stops being live, or changes project.
func putSandbox(ctx context.Context, q querier, sb *Sandbox) error {
	old, err := readStoredRow(ctx, q, sb.ID, "", false)
	if err != nil {
		return fmt.Errorf("put sandbox %s: %w", sb.ID, err)
	}
	return putSandboxOver(ctx, q, sb, old)
}

// putSandboxOver is putSandbox over old, the row as stored (read in the same transaction).
func putSandboxOver(ctx context.Context, q querier, sb *Sandbox, old storedRow) error {
	if sb.ProjectID == "" {
		sb.ProjectID = RootProjectID
	}
	wasLive := old.found && slices.Contains(liveStates, old.state)
	isLive := slices.Contains(liveStates, sb.State)
	now := usageRow{project: sb.ProjectID, tier: sb.Tier, cpus: sb.Limits.CPUs, memory: sb.Limits.MemoryBytes, disk: sb.Limits.DiskBytes + old.trajectory}
	if wasLive != isLive || (isLive && old.usage != now) {
		if wasLive {
			if err := addUsage(ctx, q, old.usage, -1); err != nil {
				return fmt.Errorf("put sandbox %s: usage: %w", sb.ID, err)
			}
		}
		if isLive {
			if err := addUsage(ctx, q, now, 1); err != nil {
				return fmt.Errorf("put sandbox %s: usage: %w", sb.ID, err)
			}
		}
	}
	if !isLive && len(sb.VolumeIDs) > 0 {
		if err := detachVolumes(ctx, q, sb.ID); err != nil {
			return fmt.Errorf("put sandbox %s: detach volumes: %w", sb.ID, err)
		}
	}
	return writeSandboxRow(ctx, q, sb, `
		ON CONFLICT (id) DO UPDATE SET node = excluded.node, state = excluded.state,
			expires_at = excluded.expires_at, doc = excluded.doc, project_id = excluded.project_id, tier = excluded.tier,
			cpus = excluded.cpus, memory_bytes = excluded.memory_bytes, disk_bytes = excluded.disk_bytes, ended_ns = excluded.ended_ns`)
}

// insertSandbox writes the row of a sandbox that admission records (its ID is new) and counts
// it in its project's usage. A plain insert: the edges' store role may add records but not
// change one (EdgeRoleSQL), so a stolen edge's credentials rewrite no record of another node.
func insertSandbox(ctx context.Context, q querier, sb *Sandbox) error {
	if sb.ProjectID == "" {
		sb.ProjectID = RootProjectID
	}
	if slices.Contains(liveStates, sb.State) {
		row := usageRow{project: sb.ProjectID, tier: sb.Tier, cpus: sb.Limits.CPUs, memory: sb.Limits.MemoryBytes, disk: sb.Limits.DiskBytes}
		if err := addUsage(ctx, q, row, 1); err != nil {
			return fmt.Errorf("admit sandbox %s: usage: %w", sb.ID, err)
		}
	}
	return writeSandboxRow(ctx, q, sb, "")
}

// writeSandboxRow inserts sb's row, with onConflict after the statement.
func writeSandboxRow(ctx context.Context, q querier, sb *Sandbox, onConflict string) error {
	project := sb.Project
	sb.Project = "" // the path is the project's, read fresh on every get
	doc, err := json.Marshal(sb)
	sb.Project = project
	if err != nil {
		return fmt.Errorf("put sandbox %s: %w", sb.ID, err)
	}
	_, err = q.ExecContext(ctx, `INSERT INTO sandboxes (id, node, state, expires_at, doc, project_id, tier, cpus, memory_bytes, disk_bytes, created_ns, ended_ns)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`+onConflict,
		sb.ID, sb.Node, sb.State, sb.ExpiresAt.UnixNano(), string(doc), sb.ProjectID, sb.Tier,
		sb.Limits.CPUs, sb.Limits.MemoryBytes, sb.Limits.DiskBytes, sb.CreatedAt.UnixNano(), endedNS(sb))
	if err != nil {
		return fmt.Errorf("put sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// endedNS is the ended_ns column of sb: when it ended (stopped or failed; now, for a record
// that says no time), 0 otherwise.
func endedNS(sb *Sandbox) int64 {
	switch {
	case sb.State != model.StateStopped && sb.State != model.StateFailed:
		return 0
	case sb.EndedAt.IsZero():
		return time.Now().UnixNano()
	}
	return sb.EndedAt.UnixNano()
}

// sandboxCols are the columns a record is read from (decodeSandbox), s being the sandboxes.
const sandboxCols = `s.doc, s.project_id, COALESCE(p.path, ''), s.activity_ns`

// decodeSandbox builds a record from its row: the document, its project's ID and path, and the
// last activity the servers recorded (activity_ns), when later than the document's.
func decodeSandbox(doc, projectID, path string, activity int64) (*Sandbox, error) {
	var sb Sandbox
	if err := json.Unmarshal([]byte(doc), &sb); err != nil {
		return nil, err
	}
	sb.ProjectID, sb.Project = projectID, iam.Display(path)
	if activity > sb.LastActivityAt.UnixNano() {
		sb.LastActivityAt = time.Unix(0, activity).UTC()
	}
	return &sb, nil
}

// GetSandbox returns the record of id, or an ErrNotFound error.
func (s *Store) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var doc, pid, path string
	var activity int64
	err := s.rdb.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes s
		LEFT JOIN projects p ON p.id = s.project_id WHERE s.id = ?`, id).Scan(&doc, &pid, &path, &activity)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.UnknownSandbox(id, "")
	}
	if err != nil {
		return nil, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	sb, err := decodeSandbox(doc, pid, path, activity)
	if err != nil {
		return nil, fmt.Errorf("decode sandbox %s: %w", id, err)
	}
	return sb, nil
}

// SandboxFilter selects sandboxes in ListSandboxes; zero fields match everything.
type SandboxFilter struct {
	Node   string
	States []string
	Labels map[string]string
	// Project keeps the sandboxes of this canonical project path's subtree; nil: all.
	Project *string
}

// ListSandboxes returns the sandboxes matching f, oldest first.
func (s *Store) ListSandboxes(ctx context.Context, f SandboxFilter) ([]*Sandbox, error) {
	q := `SELECT ` + sandboxCols + ` FROM sandboxes s LEFT JOIN projects p ON p.id = s.project_id WHERE 1 = 1`
	var args []any
	if f.Project != nil {
		cond, a := subtreeCond("p.path", *f.Project)
		q += ` AND ` + cond
		args = append(args, a...)
	}
	if f.Node != "" {
		q += ` AND s.node = ?`
		args = append(args, f.Node)
	}
	if len(f.States) > 0 {
		q += ` AND s.state IN (?` + strings.Repeat(", ?", len(f.States)-1) + `)`
		for _, st := range f.States {
			args = append(args, st)
		}
	}
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	defer rows.Close()
	var out []*Sandbox
	for rows.Next() {
		var doc, pid, path string
		var activity int64
		if err := rows.Scan(&doc, &pid, &path, &activity); err != nil {
			return nil, fmt.Errorf("list sandboxes: %w", err)
		}
		sb, err := decodeSandbox(doc, pid, path, activity)
		if err != nil {
			return nil, fmt.Errorf("list sandboxes: decode: %w", err)
		}
		if !placement.Matches(f.Labels, sb.Labels) {
			continue
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// DeleteSandbox removes a sandbox record and its trajectory (used to forget long-stopped sandboxes).
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	err := s.tx(ctx, func(tx *Tx) error {
		var u usageRow
		var state string
		err := tx.QueryRowContext(ctx, `SELECT state, project_id, tier, cpus, memory_bytes, disk_bytes + trajectory_bytes FROM sandboxes WHERE id = ?`, id).
			Scan(&state, &u.project, &u.tier, &u.cpus, &u.memory, &u.disk)
		if err == nil && slices.Contains(liveStates, state) {
			if err := addUsage(ctx, tx, u, -1); err != nil {
				return err
			}
		} else if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM trajectory WHERE sandbox_id = ?`, id); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return nil
}

// forgetBatch bounds the records ForgetEnded reads or deletes in one transaction.
const forgetBatch = 500

// ForgetEnded deletes the records (and trajectories) of sandboxes, of every node, that ended
// before `before`, and returns how many. Records that ended before the ended_ns column existed
// (migration 19) get it from their documents first, a batch at a time. Several processes may
// run it at once.
func (s *Store) ForgetEnded(ctx context.Context, before time.Time) (int, error) {
	// Every ended record written since migration 19 has its time: the fill is needed once.
	if !s.endedFilled.Load() {
		if err := s.fillEnded(ctx); err != nil {
			return 0, err
		}
		s.endedFilled.Store(true)
	}
	total := 0
	for {
		var n int
		err := s.tx(ctx, func(tx *Tx) error {
			rows, err := tx.QueryContext(ctx, `SELECT id FROM sandboxes WHERE ended_ns > 0 AND ended_ns < ? LIMIT ?`, before.UnixNano(), forgetBatch)
			if err != nil {
				return err
			}
			var ids []any
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					rows.Close()
					return err
				}
				ids = append(ids, id)
			}
			rows.Close()
			if err := rows.Err(); err != nil || len(ids) == 0 {
				return err
			}
			in := "(?" + strings.Repeat(", ?", len(ids)-1) + ")"
			if _, err := tx.ExecContext(ctx, `DELETE FROM trajectory WHERE sandbox_id IN `+in, ids...); err != nil {
				return err
			}
			// Only ended ones: a record made live again since the read keeps its row.
			res, err := tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE ended_ns > 0 AND id IN `+in, ids...)
			if err != nil {
				return err
			}
			d, err := res.RowsAffected()
			n = int(d)
			return err
		})
		if err != nil {
			return total, fmt.Errorf("forget ended sandboxes: %w", err)
		}
		total += n
		if n < forgetBatch {
			return total, nil
		}
	}
}

// fillEnded sets ended_ns of ended records that have none from their documents (now, for a
// document that says no time).
func (s *Store) fillEnded(ctx context.Context) error {
	ended := []any{model.StateStopped, model.StateFailed}
	for {
		var n int
		err := s.tx(ctx, func(tx *Tx) error {
			rows, err := tx.QueryContext(ctx, `SELECT id, doc FROM sandboxes WHERE ended_ns = 0 AND state IN (?, ?) LIMIT ?`, append(ended, forgetBatch)...)
			if err != nil {
				return err
			}
			at := map[string]int64{}
			for rows.Next() {
				var id, doc string
				if err := rows.Scan(&id, &doc); err != nil {
					rows.Close()
					return err
				}
				var sb Sandbox
				if json.Unmarshal([]byte(doc), &sb) == nil && !sb.EndedAt.IsZero() {
					at[id] = sb.EndedAt.UnixNano()
				} else {
					at[id] = time.Now().UnixNano()
				}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			for id, ns := range at {
				if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET ended_ns = ? WHERE id = ? AND ended_ns = 0 AND state IN (?, ?)`, append([]any{ns, id}, ended...)...); err != nil {
					return err
				}
			}
			n = len(at)
			return nil
		})
		if err != nil {
			return fmt.Errorf("fill in when sandboxes ended: %w", err)
		}
		if n < forgetBatch {
			return nil
		}
	}
}

// BeginStep appends e to the trajectory of sandbox, giving it the next sequence number. When
// e.StepID is set and a step with that ID exists already, nothing is written and the existing
// step is returned instead (the caller decides between replay, attach and conflict).
func (s *Store) BeginStep(ctx context.Context, sandbox string, e *model.TrajectoryEntry) (existing *model.TrajectoryEntry, err error) {
	err = s.tx(ctx, func(tx *Tx) error {
		existing, err = s.beginStep(ctx, tx, sandbox, e)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("append to trajectory of %s: %w", sandbox, err)
	}
	return existing, nil
}

// beginStep is BeginStep in tx.
func (s *Store) beginStep(ctx context.Context, tx *Tx, sandbox string, e *model.TrajectoryEntry) (existing *model.TrajectoryEntry, err error) {
	err = func() error {
		if e.StepID != "" {
			var doc string
			var exclusive bool
			err := tx.QueryRowContext(ctx, `SELECT doc, exclusive FROM trajectory WHERE sandbox_id = ? AND step_id = ?`, sandbox, e.StepID).Scan(&doc, &exclusive)
			if err == nil {
				existing = new(model.TrajectoryEntry)
				if err := json.Unmarshal([]byte(doc), existing); err != nil {
					return err
				}
				existing.Exclusive = exclusive
				return nil
			}
			if !errors.Is(err, sql.ErrNoRows) {
				return err
			}
		}
		// Appends to one trajectory take turns (a step's begin and the queued entries of other
		// execs arrive together): the sandbox's row is locked before the next number is read.
		if tx.postgres() {
			if _, err := tx.ExecContext(ctx, `SELECT 1 FROM sandboxes WHERE id = ? FOR UPDATE`, sandbox); err != nil {
				return err
			}
		}
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) + 1 FROM trajectory WHERE sandbox_id = ?`, sandbox).Scan(&e.Seq); err != nil {
			return err
		}
		doc, err := json.Marshal(e)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO trajectory (sandbox_id, seq, step_id, state, doc, exclusive, bytes) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			sandbox, e.Seq, e.StepID, e.State, string(doc), boolInt(e.Exclusive), len(doc))
		if err != nil {
			return err
		}
		return s.chargeTrajectory(ctx, tx, sandbox, int64(len(doc)))
	}()
	return existing, err
}

// UpdateStep rewrites step e.Seq of sandbox's trajectory. A step's exclusive mark is set when it
// is appended and never changes.
func (s *Store) UpdateStep(ctx context.Context, sandbox string, e *model.TrajectoryEntry) error {
	err := s.tx(ctx, func(tx *Tx) error { return s.updateStep(ctx, tx, sandbox, e) })
	if err != nil {
		return fmt.Errorf("update trajectory step %d of %s: %w", e.Seq, sandbox, err)
	}
	return nil
}

// updateStep is UpdateStep in tx.
func (s *Store) updateStep(ctx context.Context, tx *Tx, sandbox string, e *model.TrajectoryEntry) error {
	doc, err := json.Marshal(e)
	if err != nil {
		return err
	}
	var old int64
	if err := tx.QueryRowContext(ctx, `SELECT bytes FROM trajectory WHERE sandbox_id = ? AND seq = ?`, sandbox, e.Seq).Scan(&old); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE trajectory SET state = ?, doc = ?, bytes = ? WHERE sandbox_id = ? AND seq = ?`,
		e.State, string(doc), len(doc), sandbox, e.Seq); err != nil {
		return err
	}
	return s.chargeTrajectory(ctx, tx, sandbox, int64(len(doc))-old)
}

// StepWrite is one write of WriteSteps: append Entry to Sandbox's trajectory (giving it the next
// sequence number, as BeginStep; Entry.StepID must be empty), or, with Update, rewrite the step
// Entry.Seq (as UpdateStep).
type StepWrite struct {
	Sandbox string                 `json:"sandbox"`
	Entry   *model.TrajectoryEntry `json:"entry"`
	Update  bool                   `json:"update,omitempty"`
}

// WriteSteps applies writes in order in one transaction: all of them or, on an error, none
// (the entries' Seq may then have been set; the caller writes them one by one instead).
func (s *Store) WriteSteps(ctx context.Context, writes []StepWrite) error {
	err := s.tx(ctx, func(tx *Tx) error {
		for _, w := range writes {
			var err error
			if w.Update {
				err = s.updateStep(ctx, tx, w.Sandbox, w.Entry)
			} else if w.Entry.StepID != "" {
				err = fmt.Errorf("step %q: a step with an ID is appended with BeginStep", w.Entry.StepID)
			} else {
				_, err = s.beginStep(ctx, tx, w.Sandbox, w.Entry)
			}
			if err != nil {
				return fmt.Errorf("trajectory of %s: %w", w.Sandbox, err)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("write %d trajectory steps: %w", len(writes), err)
	}
	return nil
}

// StepResult is what NodeSteps did with one write: the sequence number of the step it appended
// or rewrote, or, for an append whose step ID a step has already, that step (nothing written).
type StepResult struct {
	Seq      int64                  `json:"seq"`
	Existing *model.TrajectoryEntry `json:"existing,omitempty"`
}

// NodeSteps applies writes to the trajectories of node's sandboxes (the caller checks they are
// its) in order, in one transaction with the check that epoch is still the node's: all of them
// or, on an error, none; a fenced incarnation's fail with ErrFenced. An append may carry a step
// ID (as BeginStep): when a step has it already, nothing is written for it and the result names
// that step.
func (s *Store) NodeSteps(ctx context.Context, node string, epoch int64, writes []StepWrite) ([]StepResult, error) {
	out := make([]StepResult, len(writes))
	err := s.tx(ctx, func(tx *Tx) error {
		if err := readEpoch(ctx, tx, node, epoch); err != nil {
			return err
		}
		for i, w := range writes {
			var err error
			if w.Update {
				err = s.updateStep(ctx, tx, w.Sandbox, w.Entry)
			} else {
				out[i].Existing, err = s.beginStep(ctx, tx, w.Sandbox, w.Entry)
			}
			if err != nil {
				return fmt.Errorf("trajectory of %s: %w", w.Sandbox, err)
			}
			if out[i].Existing == nil {
				out[i].Seq = w.Entry.Seq
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("write %d trajectory steps of node %s: %w", len(writes), node, err)
	}
	return out, nil
}

// chargeTrajectory adds delta bytes to sandbox's stored trajectory, and to its project's disk
// usage while it is live; past the bound it drops the outputs of the oldest finished steps
// (charging what that gives back) until the trajectory fits again or no output is left to drop.
func (s *Store) chargeTrajectory(ctx context.Context, tx *Tx, sandbox string, delta int64) error {
	var project, state string
	var total int64
	err := tx.QueryRowContext(ctx, `SELECT project_id, state, trajectory_bytes FROM sandboxes WHERE id = ?`, sandbox).Scan(&project, &state, &total)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // no record (a test's bare trajectory): nothing to charge
	}
	if err != nil {
		return err
	}
	limit := s.trajectoryMax
	if limit <= 0 {
		limit = DefaultTrajectoryBytes
	}
	for total+delta > limit {
		freed, err := dropOldestOutputs(ctx, tx, sandbox, total+delta-limit)
		if err != nil {
			return err
		}
		if freed == 0 {
			break // only running steps and steps without output are left
		}
		delta -= freed
	}
	if delta == 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET trajectory_bytes = trajectory_bytes + ? WHERE id = ?`, delta, sandbox); err != nil {
		return err
	}
	if !slices.Contains(liveStates, state) {
		return nil
	}
	ids, err := ancestorIDs(ctx, tx, project)
	if err != nil {
		return err
	}
	return addUsageTo(ctx, tx, ids, model.Usage{DiskBytes: delta})
}

// dropOldestOutputs drops the outputs of sandbox's oldest finished steps that still have them,
// until at least want bytes are freed or a batch is done; it returns the bytes freed.
func dropOldestOutputs(ctx context.Context, tx *Tx, sandbox string, want int64) (int64, error) {
	rows, err := tx.QueryContext(ctx, `SELECT seq, doc, bytes FROM trajectory WHERE sandbox_id = ? AND output_dropped = 0 AND state != ?
		ORDER BY seq LIMIT 64`, sandbox, model.StepRunning)
	if err != nil {
		return 0, err
	}
	type step struct {
		seq, bytes int64
		doc        string
	}
	var steps []step
	for rows.Next() {
		var st step
		if err := rows.Scan(&st.seq, &st.doc, &st.bytes); err != nil {
			rows.Close()
			return 0, err
		}
		steps = append(steps, st)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	var freed int64
	for _, st := range steps {
		if freed >= want {
			break
		}
		var e model.TrajectoryEntry
		if err := json.Unmarshal([]byte(st.doc), &e); err != nil {
			return freed, fmt.Errorf("decode step %d: %w", st.seq, err)
		}
		doc := []byte(st.doc)
		if len(e.Output) > 0 {
			e.Output, e.OutputDropped = nil, true
			if doc, err = json.Marshal(&e); err != nil {
				return freed, err
			}
		}
		// Marked either way, so that a step without output is not read again.
		if _, err := tx.ExecContext(ctx, `UPDATE trajectory SET doc = ?, bytes = ?, output_dropped = 1 WHERE sandbox_id = ? AND seq = ?`,
			string(doc), len(doc), sandbox, st.seq); err != nil {
			return freed, err
		}
		freed += st.bytes - int64(len(doc))
	}
	return freed, nil
}

// ListSteps returns up to limit steps of sandbox's trajectory with seq > after, in order. A
// non-empty state keeps only steps in that state.
func (s *Store) ListSteps(ctx context.Context, sandbox string, after int64, limit int, state string) ([]model.TrajectoryEntry, error) {
	q := `SELECT doc, exclusive FROM trajectory WHERE sandbox_id = ? AND seq > ?`
	args := []any{sandbox, after}
	if state != "" {
		q += ` AND state = ?`
		args = append(args, state)
	}
	q += ` ORDER BY seq LIMIT ?`
	args = append(args, limit)
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("read trajectory of %s: %w", sandbox, err)
	}
	defer rows.Close()
	var out []model.TrajectoryEntry
	for rows.Next() {
		var doc string
		var exclusive bool
		if err := rows.Scan(&doc, &exclusive); err != nil {
			return nil, fmt.Errorf("read trajectory of %s: %w", sandbox, err)
		}
		var e model.TrajectoryEntry
		if err := json.Unmarshal([]byte(doc), &e); err != nil {
			return nil, fmt.Errorf("read trajectory of %s: decode: %w", sandbox, err)
		}
		e.Exclusive = exclusive
		out = append(out, e)
	}
	return out, rows.Err()
}

// PublishLayer records l under l.Name:l.Version. Publishing the same digest again is a no-op that
// returns the existing record and created=false; another digest under a taken name:version is an
// ErrConflict error, because a published version is immutable.
func (s *Store) PublishLayer(ctx context.Context, l model.Layer) (got model.Layer, created bool, err error) {
	err = s.tx(ctx, func(tx *Tx) error {
		path, err := iam.ParsePath("project", l.Project)
		if err != nil {
			return err
		}
		proj, err := getProject(ctx, tx, path)
		if err != nil {
			return err
		}
		var owner string
		err = tx.QueryRowContext(ctx, `SELECT p.path FROM layers l JOIN projects p ON p.id = l.project_id WHERE l.name = ? LIMIT 1`, l.Name).Scan(&owner)
		if err == nil && owner != path {
			return errdefs.Conflict("layer name %s belongs to another project; choose another name", l.Name)
		} else if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		var doc string
		var wasPrivate, wasPublic bool
		err = tx.QueryRowContext(ctx, `SELECT doc, private, public FROM layers WHERE name = ? AND version = ?`, l.Name, l.Version).Scan(&doc, &wasPrivate, &wasPublic)
		switch {
		case err == nil:
			if err := json.Unmarshal([]byte(doc), &got); err != nil {
				return err
			}
			got.Project, got.Private, got.Public = iam.Display(path), wasPrivate, wasPublic
			if got.Digest != l.Digest {
				return errdefs.Conflict("layer %s:%s is already published with digest %s; versions are immutable, publish a new version",
					l.Name, l.Version, got.Digest)
			}
			if got.Kind != l.Kind {
				return errdefs.Conflict("layer %s:%s is already published as kind %s", l.Name, l.Version, got.Kind)
			}
			if !slices.Equal(got.Below, l.Below) {
				return errdefs.Conflict("layer %s:%s is already published stacked on %v", l.Name, l.Version, got.Below)
			}
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		private, public := l.Private, l.Public
		if private && public {
			return errdefs.Invalid("public", "a layer cannot be both private and public")
		}
		l.Project, l.Private, l.Public = "", false, false // the columns say
		b, err := json.Marshal(l)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO layers (name, version, kind, digest, created_at, doc, project_id, private, public) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			l.Name, l.Version, l.Kind, l.Digest, l.CreatedAt.UnixNano(), string(b), proj.ID, boolInt(private), boolInt(public)); err != nil {
			return err
		}
		l.Project, l.Private, l.Public = iam.Display(path), private, public
		got, created = l, true
		return nil
	})
	if isUnique(err) { // published by another transaction meanwhile (PostgreSQL)
		err = errdefs.Conflict("layer %s:%s was published at the same moment by another request; look it up or try again", l.Name, l.Version)
	}
	if err != nil {
		return model.Layer{}, false, fmt.Errorf("publish layer %s:%s: %w", l.Name, l.Version, err)
	}
	return got, created, nil
}

// GetLayer returns the layer published as name:version, or an ErrNotFound error.
func (s *Store) GetLayer(ctx context.Context, name, version string) (model.Layer, error) {
	var doc, path string
	var private, public bool
	err := s.rdb.QueryRowContext(ctx, `SELECT l.doc, COALESCE(p.path, ''), l.private, l.public FROM layers l LEFT JOIN projects p ON p.id = l.project_id
		WHERE l.name = ? AND l.version = ?`, name, version).Scan(&doc, &path, &private, &public)
	if errors.Is(err, sql.ErrNoRows) {
		// A tag (python:latest) names the version it points at now.
		err = s.rdb.QueryRowContext(ctx, `SELECT l.doc, COALESCE(p.path, ''), l.private, l.public FROM layer_tags t
			JOIN layers l ON l.name = t.name AND l.version = t.version LEFT JOIN projects p ON p.id = l.project_id
			WHERE t.name = ? AND t.tag = ?`, name, version).Scan(&doc, &path, &private, &public)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return model.Layer{}, errdefs.NotFound("layer %s:%s", name, version)
	}
	if err != nil {
		return model.Layer{}, fmt.Errorf("get layer %s:%s: %w", name, version, err)
	}
	var l model.Layer
	if err := json.Unmarshal([]byte(doc), &l); err != nil {
		return model.Layer{}, fmt.Errorf("decode layer %s:%s: %w", name, version, err)
	}
	l.Project, l.Private, l.Public = iam.Display(path), private, public
	if l.Tags, err = s.layerTags(ctx, l.Name, l.Version); err != nil {
		return model.Layer{}, err
	}
	return l, nil
}

// SetLayerFillRate sets the background fill rate of the published version name:version (a
// setting kept in its record; the content stays immutable) and returns the layer.
func (s *Store) SetLayerFillRate(ctx context.Context, name, version string, rate int64) (model.Layer, error) {
	err := s.tx(ctx, func(tx *Tx) error {
		var doc string
		err := tx.QueryRowContext(ctx, `SELECT doc FROM layers WHERE name = ? AND version = ?`, name, version).Scan(&doc)
		if errors.Is(err, sql.ErrNoRows) {
			return errdefs.NotFound("layer %s:%s", name, version)
		}
		if err != nil {
			return err
		}
		var l model.Layer
		if err := json.Unmarshal([]byte(doc), &l); err != nil {
			return err
		}
		l.FillRate = rate
		b, err := json.Marshal(l)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE layers SET doc = ? WHERE name = ? AND version = ?`, string(b), name, version)
		return err
	})
	if err != nil {
		return model.Layer{}, fmt.Errorf("set fill rate of layer %s:%s: %w", name, version, err)
	}
	return s.GetLayer(ctx, name, version)
}

// SetLayerPublic shows the published version name:version to every project (public) or takes
// it back to its default visibility, and returns the layer. Making a layer public clears private.
func (s *Store) SetLayerPublic(ctx context.Context, name, version string, public bool) (model.Layer, error) {
	q := `UPDATE layers SET public = 0 WHERE name = ? AND version = ?`
	if public {
		q = `UPDATE layers SET public = 1, private = 0 WHERE name = ? AND version = ?`
	}
	res, err := s.db.ExecContext(ctx, q, name, version)
	if err != nil {
		return model.Layer{}, fmt.Errorf("set visibility of layer %s:%s: %w", name, version, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return model.Layer{}, errdefs.NotFound("layer %s:%s", name, version)
	}
	return s.GetLayer(ctx, name, version)
}

// layerTags returns the tags pointing at name:version.
func (s *Store) layerTags(ctx context.Context, name, version string) ([]string, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT tag FROM layer_tags WHERE name = ? AND version = ? ORDER BY tag`, name, version)
	if err != nil {
		return nil, fmt.Errorf("layer tags of %s:%s: %w", name, version, err)
	}
	defer rows.Close()
	var tags []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, err
		}
		tags = append(tags, t)
	}
	return tags, rows.Err()
}

// TagLayer points name:tag at the published version name:version (moving it if it pointed
// elsewhere). A tag may not shadow a published version.
func (s *Store) TagLayer(ctx context.Context, name, tag, version string) (model.Layer, error) {
	err := s.tx(ctx, func(tx *Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM layers WHERE name = ? AND version = ?`, name, tag).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return errdefs.Conflict("%s:%s is a published version, not a tag; versions are immutable", name, tag)
		}
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM layers WHERE name = ? AND version = ?`, name, version).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return errdefs.NotFound("layer %s:%s", name, version)
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO layer_tags (name, tag, version, updated_at) VALUES (?, ?, ?, ?)
			ON CONFLICT (name, tag) DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at`,
			name, tag, version, time.Now().UnixNano())
		return err
	})
	if err != nil {
		return model.Layer{}, fmt.Errorf("tag %s:%s: %w", name, tag, err)
	}
	return s.GetLayer(ctx, name, version)
}

// PutEnvironment saves env under its name. Saving the same composition again is a no-op that
// returns the existing record; another composition under a taken name is ErrConflict (delete it
// first).
func (s *Store) PutEnvironment(ctx context.Context, env model.Environment) (model.Environment, error) {
	return s.putEnvironment(ctx, env, false)
}

// ReplaceEnvironment is PutEnvironment that replaces the composition of an environment of the
// same project (a rebuilt environment); sandboxes made from the old one keep what they got.
func (s *Store) ReplaceEnvironment(ctx context.Context, env model.Environment) (model.Environment, error) {
	return s.putEnvironment(ctx, env, true)
}

func (s *Store) putEnvironment(ctx context.Context, env model.Environment, replace bool) (model.Environment, error) {
	var got model.Environment
	err := s.tx(ctx, func(tx *Tx) error {
		path, err := iam.ParsePath("project", env.Project)
		if err != nil {
			return err
		}
		proj, err := getProject(ctx, tx, path)
		if err != nil {
			return err
		}
		env.Project = iam.Display(path)
		var doc, owner string
		err = tx.QueryRowContext(ctx, `SELECT e.doc, COALESCE(p.path, '') FROM environments e LEFT JOIN projects p ON p.id = e.project_id
			WHERE e.name = ?`, env.Name).Scan(&doc, &owner)
		if err == nil {
			if owner != path {
				return errdefs.Conflict("environment name %s belongs to another project; choose another name", env.Name)
			}
			if err := json.Unmarshal([]byte(doc), &got); err != nil {
				return err
			}
			if replace {
				// A rebuild keeps the pool size and where the environment runs (tier, runtime):
				// they are no part of the composition.
				env.Warm, env.Tier, env.Runtime = got.Warm, got.Tier, got.Runtime
			}
			same := got.Base == env.Base && got.Workspace == env.Workspace && slices.Equal(got.Toolkits, env.Toolkits) && got.MicroVMTemplate == env.MicroVMTemplate &&
				got.Tier == env.Tier && got.Runtime == env.Runtime && reflect.DeepEqual(got.Network, env.Network)
			if !same && replace {
				b, err := json.Marshal(env)
				if err != nil {
					return err
				}
				got = env
				_, err = tx.ExecContext(ctx, `UPDATE environments SET doc = ?, created_at = ?, warm = ? WHERE name = ?`, string(b), env.CreatedAt.UnixNano(), env.Warm, env.Name)
				return err
			}
			if !same {
				return errdefs.Conflict("environment %s exists with another composition; delete it first or use another name", env.Name)
			}
			if got.Warm == env.Warm {
				return nil
			}
			// The pool size is no part of the composition: saving it again changes it.
			got.Warm = env.Warm
			return putEnvironmentWarm(ctx, tx, got)
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		b, err := json.Marshal(env)
		if err != nil {
			return err
		}
		got = env
		_, err = tx.ExecContext(ctx, `INSERT INTO environments (name, created_at, doc, project_id, warm) VALUES (?, ?, ?, ?, ?)`, env.Name, env.CreatedAt.UnixNano(), string(b), proj.ID, env.Warm)
		return err
	})
	if err != nil {
		return model.Environment{}, fmt.Errorf("save environment %s: %w", env.Name, err)
	}
	return got, nil
}

// putEnvironmentWarm writes env's document and pool size.
func putEnvironmentWarm(ctx context.Context, tx *Tx, env model.Environment) error {
	b, err := json.Marshal(env)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `UPDATE environments SET doc = ?, warm = ? WHERE name = ?`, string(b), env.Warm, env.Name)
	return err
}

// SetEnvironmentWarm changes the pool size of the environment saved as name and returns it
// (ErrNotFound when there is none).
func (s *Store) SetEnvironmentWarm(ctx context.Context, name string, warm int) (model.Environment, error) {
	var env model.Environment
	err := s.tx(ctx, func(tx *Tx) error {
		var doc, path string
		err := tx.QueryRowContext(ctx, `SELECT e.doc, COALESCE(p.path, '') FROM environments e LEFT JOIN projects p ON p.id = e.project_id
			WHERE e.name = ?`, name).Scan(&doc, &path)
		if errors.Is(err, sql.ErrNoRows) {
			return errdefs.NotFound("environment %s", name)
		}
		if err != nil {
			return err
		}
		if err := json.Unmarshal([]byte(doc), &env); err != nil {
			return err
		}
		env.Project = iam.Display(path)
		env.Warm = warm
		return putEnvironmentWarm(ctx, tx, env)
	})
	if err != nil {
		return model.Environment{}, fmt.Errorf("set the warm pool of environment %s: %w", name, err)
	}
	return env, nil
}

// WarmEnvironments returns the environments with a warm pool (Warm > 0), by name.
func (s *Store) WarmEnvironments(ctx context.Context) ([]model.Environment, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT e.doc, COALESCE(p.path, '') FROM environments e LEFT JOIN projects p ON p.id = e.project_id
		WHERE e.warm > 0 ORDER BY e.name`)
	if err != nil {
		return nil, fmt.Errorf("list warm environments: %w", err)
	}
	return scanEnvironments(rows)
}

// GetEnvironment returns the environment saved as name, or an ErrNotFound error.
func (s *Store) GetEnvironment(ctx context.Context, name string) (model.Environment, error) {
	var doc, path string
	err := s.rdb.QueryRowContext(ctx, `SELECT e.doc, COALESCE(p.path, '') FROM environments e LEFT JOIN projects p ON p.id = e.project_id
		WHERE e.name = ?`, name).Scan(&doc, &path)
	if errors.Is(err, sql.ErrNoRows) {
		return model.Environment{}, errdefs.NotFound("environment %s", name)
	}
	if err != nil {
		return model.Environment{}, fmt.Errorf("get environment %s: %w", name, err)
	}
	var env model.Environment
	err = json.Unmarshal([]byte(doc), &env)
	env.Project = iam.Display(path)
	return env, err
}

// ListEnvironments returns the saved environments by name.
func (s *Store) ListEnvironments(ctx context.Context) ([]model.Environment, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT e.doc, COALESCE(p.path, '') FROM environments e LEFT JOIN projects p ON p.id = e.project_id ORDER BY e.name`)
	if err != nil {
		return nil, fmt.Errorf("list environments: %w", err)
	}
	return scanEnvironments(rows)
}

// scanEnvironments reads rows of (doc, project path) into environments, and closes rows.
func scanEnvironments(rows *sql.Rows) ([]model.Environment, error) {
	defer rows.Close()
	out := []model.Environment{}
	for rows.Next() {
		var doc, path string
		if err := rows.Scan(&doc, &path); err != nil {
			return nil, err
		}
		var env model.Environment
		if err := json.Unmarshal([]byte(doc), &env); err != nil {
			return nil, err
		}
		env.Project = iam.Display(path)
		out = append(out, env)
	}
	return out, rows.Err()
}

// DeleteEnvironment removes a saved environment; sandboxes made from it are not affected.
func (s *Store) DeleteEnvironment(ctx context.Context, name string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM environments WHERE name = ?`, name)
	if err != nil {
		return fmt.Errorf("delete environment %s: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFound("environment %s", name)
	}
	return nil
}

// instanceSetting keeps a node's instance name: one per node, since the nodes of a cluster share
// one store ("edge.instance" alone, the key before cluster mode, is taken over by its node).
const instanceSetting = "edge.instance"

var instanceRE = lazyregexp.New(`^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?-[0-9a-f]{16}$`)

// Instance returns node's instance name ("<node>-<16 hex digits>"), choosing it on the first
// call. Corrals that share a blob store tell their refs and imports apart by it.
func (s *Store) Instance(ctx context.Context, node string) (string, error) {
	key := instanceSetting + "/" + node
	b, err := s.GetSetting(ctx, key)
	if err == nil && instanceRE.Match(b) {
		return string(b), nil
	}
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return "", err
	}
	if old, err := s.GetSetting(ctx, instanceSetting); err == nil && instanceRE.Match(old) && strings.HasPrefix(string(old), node+"-") {
		return string(old), s.PutSetting(ctx, key, old)
	}
	var r [8]byte
	rand.Read(r[:])
	inst := node + "-" + hex.EncodeToString(r[:])
	return inst, s.PutSetting(ctx, key, []byte(inst))
}

// PutFncallEnv saves an fncall environment under its name; a taken name is ErrConflict (delete it
// first: its pool would otherwise serve calls with the old definition).
func (s *Store) PutFncallEnv(ctx context.Context, env model.FncallEnv) error {
	env.Pool = nil
	path, err := iam.ParsePath("project", env.Project)
	if err != nil {
		return err
	}
	env.Project = ""
	b, err := json.Marshal(env)
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO fncall_envs (name, created_at, doc, project_id) VALUES (?, ?, ?, (SELECT id FROM projects WHERE path = ?))`,
		env.Name, env.CreatedAt.UnixNano(), string(b), path)
	if isUnique(err) {
		return errdefs.Conflict("fncall environment %s exists; delete it first or use another name", env.Name)
	}
	if err != nil {
		return fmt.Errorf("save fncall environment %s: %w", env.Name, err)
	}
	return nil
}

// FncallEnvRecord is a saved fncall environment and the ID of its project (whose quota its pool
// containers are charged to).
type FncallEnvRecord struct {
	model.FncallEnv
	ProjectID string `json:"project_id"`
}

// ListFncallEnvs returns the fncall environments by name.
func (s *Store) ListFncallEnvs(ctx context.Context) ([]FncallEnvRecord, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT f.doc, f.project_id, COALESCE(p.path, '') FROM fncall_envs f LEFT JOIN projects p ON p.id = f.project_id ORDER BY f.name`)
	if err != nil {
		return nil, fmt.Errorf("list fncall environments: %w", err)
	}
	defer rows.Close()
	out := []FncallEnvRecord{}
	for rows.Next() {
		var doc, path string
		var env FncallEnvRecord
		if err := rows.Scan(&doc, &env.ProjectID, &path); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(doc), &env.FncallEnv); err != nil {
			return nil, err
		}
		env.Project = iam.Display(path)
		out = append(out, env)
	}
	return out, rows.Err()
}

// DeleteFncallEnv removes an fncall environment, or fails with ErrNotFound.
func (s *Store) DeleteFncallEnv(ctx context.Context, name string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM fncall_envs WHERE name = ?`, name)
	if err != nil {
		return fmt.Errorf("delete fncall environment %s: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFound("fncall environment %s", name)
	}
	return nil
}

// ListLayers returns published layers (of one name when name is set), by name then creation time.
func (s *Store) ListLayers(ctx context.Context, name string) ([]model.Layer, error) {
	q, args := `SELECT l.doc, COALESCE(p.path, ''), l.private, l.public FROM layers l LEFT JOIN projects p ON p.id = l.project_id`, []any{}
	if name != "" {
		q += ` WHERE l.name = ?`
		args = append(args, name)
	}
	q += ` ORDER BY l.name, l.created_at, l.version`
	rows, err := s.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	defer rows.Close()
	var out []model.Layer
	for rows.Next() {
		var doc, path string
		var private, public bool
		if err := rows.Scan(&doc, &path, &private, &public); err != nil {
			return nil, fmt.Errorf("list layers: %w", err)
		}
		var l model.Layer
		if err := json.Unmarshal([]byte(doc), &l); err != nil {
			return nil, fmt.Errorf("list layers: decode: %w", err)
		}
		l.Project, l.Private, l.Public = iam.Display(path), private, public
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows.Close()
	for i := range out {
		if out[i].Tags, err = s.layerTags(ctx, out[i].Name, out[i].Version); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// DeleteLayer removes the published version name:version. It is refused (ErrConflict, naming
// the reference) while a tag points at it, a saved environment names it (directly or through a
// tag), or a snapshot layer stacks on it. The layer's tree is the caller's to remove when no
// other version has the same digest and no sandbox uses it (DigestsInUse).
func (s *Store) DeleteLayer(ctx context.Context, name, version string) (model.Layer, error) {
	var l model.Layer
	err := s.tx(ctx, func(tx *Tx) error {
		var doc string
		err := tx.QueryRowContext(ctx, `SELECT doc FROM layers WHERE name = ? AND version = ?`, name, version).Scan(&doc)
		if errors.Is(err, sql.ErrNoRows) {
			return errdefs.NotFound("layer %s:%s", name, version)
		} else if err != nil {
			return err
		}
		if err := json.Unmarshal([]byte(doc), &l); err != nil {
			return err
		}
		refs := map[string]bool{name + ":" + version: true}
		rows, err := tx.QueryContext(ctx, `SELECT tag FROM layer_tags WHERE name = ? AND version = ?`, name, version)
		if err != nil {
			return err
		}
		var tags []string
		for rows.Next() {
			var t string
			rows.Scan(&t)
			tags = append(tags, t)
		}
		rows.Close()
		if len(tags) > 0 {
			return errdefs.Conflict("layer %s:%s is tagged %s: move or delete the tag first", name, version, strings.Join(tags, ", "))
		}
		envs, err := tx.QueryContext(ctx, `SELECT doc FROM environments`)
		if err != nil {
			return err
		}
		defer envs.Close()
		for envs.Next() {
			var d string
			envs.Scan(&d)
			var env model.Environment
			if json.Unmarshal([]byte(d), &env) == nil {
				for _, r := range append([]string{env.Base, env.Workspace}, env.Toolkits...) {
					if refs[r] {
						return errdefs.Conflict("layer %s:%s is used by environment %s: delete or change it first", name, version, env.Name)
					}
				}
			}
		}
		envs.Close()
		fenvs, err := tx.QueryContext(ctx, `SELECT doc FROM fncall_envs`)
		if err != nil {
			return err
		}
		defer fenvs.Close()
		for fenvs.Next() {
			var d string
			fenvs.Scan(&d)
			var env model.FncallEnv
			if json.Unmarshal([]byte(d), &env) == nil {
				for _, r := range append([]string{env.Base, env.Workspace}, env.Toolkits...) {
					if refs[r] {
						return errdefs.Conflict("layer %s:%s is used by fncall environment %s: delete it first", name, version, env.Name)
					}
				}
			}
		}
		fenvs.Close()
		stacked, err := tx.QueryContext(ctx, `SELECT doc FROM layers WHERE doc LIKE '%"below":%'`)
		if err != nil {
			return err
		}
		defer stacked.Close()
		for stacked.Next() {
			var d string
			stacked.Scan(&d)
			var top model.Layer
			if json.Unmarshal([]byte(d), &top) == nil && slices.ContainsFunc(top.Below, func(r string) bool { return refs[r] }) {
				return errdefs.Conflict("layer %s:%s is a part below %s:%s: delete that first", name, version, top.Name, top.Version)
			}
		}
		stacked.Close()
		snaps, err := tx.QueryContext(ctx, `SELECT doc FROM layers WHERE kind = ?`, model.KindSnapshot)
		if err != nil {
			return err
		}
		defer snaps.Close()
		for snaps.Next() {
			var d string
			snaps.Scan(&d)
			var sl model.Layer
			if json.Unmarshal([]byte(d), &sl) == nil && sl.Snapshot != nil {
				for _, r := range append(append([]string{sl.Snapshot.Base, sl.Snapshot.Workspace}, sl.Snapshot.Toolkits...), sl.Snapshot.Parents...) {
					if refs[r] {
						return errdefs.Conflict("layer %s:%s is below snapshot %s:%s: delete the snapshot first", name, version, sl.Name, sl.Version)
					}
				}
			}
		}
		snaps.Close()
		_, err = tx.ExecContext(ctx, `DELETE FROM layers WHERE name = ? AND version = ?`, name, version)
		return err
	})
	if err != nil {
		return model.Layer{}, fmt.Errorf("delete layer %s:%s: %w", name, version, err)
	}
	return l, nil
}

// DeleteTag removes the tag name:tag (the version it pointed at stays).
func (s *Store) DeleteTag(ctx context.Context, name, tag string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM layer_tags WHERE name = ? AND tag = ?`, name, tag)
	if err != nil {
		return fmt.Errorf("delete tag %s:%s: %w", name, tag, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFound("tag %s:%s", name, tag)
	}
	return nil
}

// GetSetting returns the operator setting key (a JSON document), or an ErrNotFound error.
func (s *Store) GetSetting(ctx context.Context, key string) ([]byte, error) {
	var doc string
	err := s.rdb.QueryRowContext(ctx, `SELECT doc FROM settings WHERE key = ?`, key).Scan(&doc)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.NotFound("setting %s", key)
	}
	if err != nil {
		return nil, fmt.Errorf("get setting %s: %w", key, err)
	}
	return []byte(doc), nil
}

// PutSettingIfAbsent stores the setting key unless it exists, and reports whether it did: of
// several processes racing to set it, exactly one does.
func (s *Store) PutSettingIfAbsent(ctx context.Context, key string, doc []byte) (bool, error) {
	res, err := s.db.ExecContext(ctx, `INSERT INTO settings (key, doc) VALUES (?, ?) ON CONFLICT (key) DO NOTHING`, key, string(doc))
	if err != nil {
		return false, fmt.Errorf("put setting %s: %w", key, err)
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// PutSetting stores the operator setting key.
func (s *Store) PutSetting(ctx context.Context, key string, doc []byte) error {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO settings (key, doc) VALUES (?, ?)
		ON CONFLICT (key) DO UPDATE SET doc = excluded.doc`, key, string(doc)); err != nil {
		return fmt.Errorf("put setting %s: %w", key, err)
	}
	return nil
}

// DigestsInUse returns which of digests a published version names or a live sandbox of any
// node has in its rootfs: the blobs GC must keep. It reads the live sandboxes once, whatever
// the number of digests.
func (s *Store) DigestsInUse(ctx context.Context, digests []string) (map[string]bool, error) {
	out := make(map[string]bool, len(digests))
	if len(digests) == 0 {
		return out, nil
	}
	wanted := make(map[string]bool, len(digests))
	for batch := range slices.Chunk(digests, 500) {
		args := make([]any, len(batch))
		for i, d := range batch {
			args[i], wanted[d] = d, true
		}
		if err := s.publishedDigests(ctx, args, out); err != nil {
			return nil, fmt.Errorf("check layer digests: %w", err)
		}
	}
	recs, err := s.ListSandboxes(ctx, SandboxFilter{States: LiveStates()})
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		for _, d := range r.Lower {
			if wanted[d] {
				out[d] = true
			}
		}
	}
	return out, nil
}

// publishedDigests marks in out those of digests (args) that a published version names.
func (s *Store) publishedDigests(ctx context.Context, digests []any, out map[string]bool) error {
	rows, err := s.rdb.QueryContext(ctx, `SELECT DISTINCT digest FROM layers WHERE digest IN (?`+strings.Repeat(", ?", len(digests)-1)+`)`, digests...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			return err
		}
		out[d] = true
	}
	return rows.Err()
}
