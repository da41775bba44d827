package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/events"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store/pgtest"
)

// TestEdgeRole: a store opened as the edge role (ApplyEdgeRole) opens without migrating, reads
// what an edge reads and writes nothing: it can neither read nor write identity, change
// projects, the catalogue (layers, tags, environments), sandbox records, volumes or quota usage,
// nor see or write the cluster's secret settings; the owner still sees everything.
func TestEdgeRole(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.NewDB(t) // skips where PostgreSQL is missing
	owner, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	if err := owner.AddRootToken(ctx, "hash-of-the-root-token"); err != nil {
		t.Fatal(err)
	}
	if err := owner.PutSetting(ctx, "cluster.ca", []byte(`{"key":"the CA's private key"}`)); err != nil {
		t.Fatal(err)
	}
	if err := owner.PutSetting(ctx, "service_catalog", []byte(`{"services":{}}`)); err != nil {
		t.Fatal(err)
	}
	role := fmt.Sprintf("corral_edge_t%d", os.Getpid())
	if _, err := owner.ApplyEdgeRole(ctx, "Bad-Name", ""); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("a bad role name: %v", err)
	}
	ran, err := owner.ApplyEdgeRole(ctx, role, "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ran[0], "CREATE ROLE "+role) {
		t.Errorf("the first statement %q does not create the role", ran[0])
	}
	if _, err := owner.ApplyEdgeRole(ctx, role, ""); err != nil { // again, as after an upgrade
		t.Fatalf("applying the role a second time: %v", err)
	}

	edge, err := Open(ctx, strings.Replace(dsn, "postgres://postgres@", "postgres://"+role+"@", 1))
	if err != nil {
		t.Fatalf("open the store as the edge role: %v", err)
	}
	defer edge.Close()
	// The settings are the servers': an edge has its instance name from its registration and
	// the service catalogue from the servers' configuration; a stolen edge can neither read the
	// cluster's secrets nor widen every node's egress.
	if _, err := edge.Instance(ctx, "n1"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("the edge's instance name as the edge: %v (want permission denied)", err)
	}
	if _, err := edge.GetSetting(ctx, "service_catalog"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("the service catalogue as the edge: %v (want permission denied)", err)
	}
	if err := edge.PutSetting(ctx, "service_catalog", []byte(`{"services":{"x":{}}}`)); err == nil {
		t.Error("the edge role replaced the service catalogue")
	}
	if b, err := owner.GetSetting(ctx, "service_catalog"); err != nil || string(b) != `{"services":{}}` {
		t.Errorf("the service catalogue after the edge's attempt: %q, %v", b, err)
	}
	// The node's lease is the servers' to write (the node channel), and so are admission and
	// every record write: the role reads records and adds or changes none, its node's or
	// another's, and takes no quota.
	if _, err := owner.Register(ctx, Node{Name: "n1", URL: "https://127.0.0.1:1"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	p := mustProject(t, owner, "edge-role-p")
	sb := newRecord(p.ID, 0)
	sb.Node = "n1"
	if err := edge.AdmitSandbox(ctx, sb, nil); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("admit a sandbox as the edge role: %v, want permission denied", err)
	}
	if err := owner.AdmitNodeSandbox(ctx, "n1", 1, sb, &Idempotency{Principal: "root", Key: "k", RequestHash: "h"}); err != nil {
		t.Errorf("the servers admit it: %v", err)
	}
	if err := edge.CheckIdempotency(ctx, &Idempotency{Principal: "root", Key: "k", RequestHash: "h"}); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("read a principal's idempotency keys as the edge role: %v, want permission denied", err)
	}
	if got, err := edge.GetSandbox(ctx, sb.ID); err != nil || got.State != model.StateCreating {
		t.Errorf("read the admitted record as the edge role: %+v, %v", got, err)
	}
	sb.State = model.StateRunning
	if err := edge.PutSandbox(ctx, sb); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("rewrite an admitted record as the edge role: %v, want permission denied", err)
	}
	if err := owner.PutNodeSandbox(ctx, "n1", 1, sb); err != nil {
		t.Errorf("the servers write it: %v", err)
	}
	var sbPriv string
	if err := edge.db.QueryRowContext(ctx, `SELECT has_table_privilege('sandboxes', 'SELECT')::text || has_table_privilege('sandboxes', 'INSERT')::text || has_table_privilege('sandboxes', 'UPDATE')::text || has_table_privilege('sandboxes', 'DELETE')::text`).Scan(&sbPriv); err != nil || sbPriv != "truefalsefalsefalse" {
		t.Errorf("the edge role on sandboxes (select, insert, update, delete): %s, %v; want read only", sbPriv, err)
	}
	if _, err := edge.Register(ctx, Node{Name: "n2", URL: "https://127.0.0.1:2"}, time.Minute); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("register a node as the edge role: %v, want permission denied", err)
	}
	if _, err := edge.Heartbeat(ctx, "n1", 1, Resources{}, time.Hour, nil); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("renew a lease as the edge role: %v, want permission denied", err)
	}
	for _, table := range []string{"projects", "layers", "environments", "fncall_envs", "layer_tags", "nodes", "volumes", "volume_attachments", "volume_copies", "project_usage", "project_tier_usage"} {
		if _, err := edge.db.ExecContext(ctx, `SELECT count(*) FROM `+table); err != nil {
			t.Errorf("read %s as the edge: %v", table, err)
		}
	}
	// The audit log is the servers' to write (the node channel, as the caller they sealed for
	// the edge): the role cannot forge an entry in anyone's name.
	if err := edge.AddAudit(ctx, model.AuditEntry{At: time.Now(), Principal: "root", Project: "/", Action: "sandbox.delete", Target: "sb-n1-aaaaaaaaaaaaaaaa", Result: "ok"}, "/"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("audit as the edge: %v, want permission denied", err)
	}
	var seqUse bool
	if err := edge.db.QueryRowContext(ctx, `SELECT bool_or(has_sequence_privilege(c.oid, 'USAGE')) FROM pg_class c WHERE c.relkind = 'S' AND c.relnamespace = current_schema()::regnamespace`).Scan(&seqUse); err != nil || seqUse {
		t.Errorf("the edge role draws a sequence's numbers: %v, %v", seqUse, err)
	}
	// The events go through the servers (the node channel), which check whose they are: the
	// role cannot forge one, for its own node or another's.
	ev := events.Event{ID: "ev-n2-1", At: time.Now().UTC(), Type: events.Deleted, Sandbox: "sb-n2-aaaaaaaaaaaaaaaa", Project: "/", Node: "n2"}
	if err := edge.AddEvents(ctx, []events.Event{ev}); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("record an event as the edge role: %v, want permission denied", err)
	}
	if err := owner.AddEvents(ctx, []events.Event{ev}); err != nil {
		t.Errorf("record an event as the owner (a server): %v", err)
	}
	// What it may not.
	for _, q := range []string{
		`SELECT count(*) FROM api_tokens`,
		`INSERT INTO api_tokens (id, hash, principal, project_id, perms, role, parent, created_at, expires_at, revoked_at) VALUES ('t', 'h', 'root', 'p', 1, 'owner', '', 0, 0, 0)`,
		`SELECT count(*) FROM grants`,
		`SELECT count(*) FROM principals`,
		`UPDATE projects SET quota = '{}'`,
		`INSERT INTO layer_tags (name, tag, version, updated_at) VALUES ('python', 'latest', 'evil', 0)`,
		`UPDATE layers SET digest = 'sha256:evil'`,
		`UPDATE layers SET doc = '{}'`,
		`DELETE FROM layers`,
		`INSERT INTO layers (name, version, kind, digest, created_at, doc, project_id, private, public) VALUES ('python', 'evil', 'base', 'sha256:x', 0, '{}', 'p', 0, 1)`,
		`UPDATE environments SET doc = '{}'`,
		`DELETE FROM environments`,
		`INSERT INTO environments (name, created_at, doc, project_id, warm) VALUES ('evil', 0, '{}', 'p', 0)`,
		`DELETE FROM fncall_envs`,
		`INSERT INTO fncall_envs (name, created_at, doc, project_id) VALUES ('evil', 0, '{}', 'p')`,
		`DELETE FROM layer_tags`,
		`DELETE FROM projects`,
		`SELECT count(*) FROM webhooks`,
		`SELECT count(*) FROM webhook_deliveries`,
		`SELECT count(*) FROM audit`,
		`INSERT INTO audit (at, principal, token_id, project_id, project_path, action, target, result, detail) VALUES (0, 'root', '', '', '', 'x', '', 'ok', '')`,
		`DELETE FROM audit`,
		`UPDATE audit SET result = 'ok'`,
		`SELECT doc FROM events`,
		`SELECT id FROM events`,
		`DELETE FROM events`,
		`UPDATE nodes SET epoch = epoch + 1`,
		`UPDATE nodes SET state = 'ready'`,
		`DELETE FROM nodes`,
		`SELECT count(*) FROM servers`,
		`SELECT count(*) FROM sandbox_usage`,
		`SELECT count(*) FROM trajectory`,
		`DELETE FROM trajectory`,
		`UPDATE sandbox_usage SET tokens = 0`,
		`UPDATE sandboxes SET project_id = 'elsewhere'`,
		`DELETE FROM sandboxes`,
		`INSERT INTO sandboxes (id, node, state, expires_at, doc, project_id, tier, cpus, memory_bytes, disk_bytes, created_ns, ended_ns) VALUES ('sb-n2-x', 'n2', 'running', 0, '{}', 'p', 'container', 0, 0, 0, 0, 0)`,
		`SELECT count(*) FROM idempotency`,
		`DELETE FROM idempotency`,
		`DELETE FROM volume_attachments`,
		`INSERT INTO volume_attachments (volume_id, sandbox_id, read_only) VALUES ('v', 'sb', 0)`,
		`SELECT epoch FROM nodes FOR UPDATE`,
		`UPDATE project_usage SET sandboxes = 0, cpus = 0, disk_bytes = 0`,
		`DELETE FROM project_tier_usage`,
		`UPDATE volumes SET version = version + 1`,
		`DELETE FROM volumes`,
		`INSERT INTO volume_copies (volume_id, node, version) VALUES ('v', 'n1', 1)`,
	} {
		if _, err := edge.db.ExecContext(ctx, q); err == nil || !strings.Contains(err.Error(), "permission denied") {
			t.Errorf("as the edge role, %s: %v (want permission denied)", q, err)
		}
	}
	if _, err := edge.GetSetting(ctx, "cluster.ca"); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("the CA's key as the edge: %v (want permission denied)", err)
	}
	if err := edge.PutSetting(ctx, "cluster.ca", []byte(`{"key":"mine"}`)); err == nil {
		t.Error("the edge role replaced the cluster CA")
	}
	if err := edge.PutSetting(ctx, "cluster.join.token", []byte(`"mine"`)); err == nil {
		t.Error("the edge role wrote a join token")
	}
	// The owner keeps every setting.
	if b, err := owner.GetSetting(ctx, "cluster.ca"); err != nil || !strings.Contains(string(b), "private key") {
		t.Errorf("the CA as the owner: %q, %v", b, err)
	}
}

// TestEdgeRoleTables: every table of the store is in one of the edge role's lists, so a
// table a release adds is given its privileges on purpose (unnamed, it gets none).
func TestEdgeRoleTables(t *testing.T) {
	s := open(t)
	rows, err := s.db.QueryContext(context.Background(), `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var table string
		if err := rows.Scan(&table); err != nil {
			t.Fatal(err)
		}
		if slices.Contains(edgeDenied, table) == slices.Contains(edgeReadOnly, table) {
			t.Errorf("table %s is in both or neither of the edge role's lists (edgeDenied, edgeReadOnly); want one", table)
		}
		n++
	}
	if err := rows.Err(); err != nil || n < 20 {
		t.Fatalf("%d tables, %v", n, err)
	}
}
