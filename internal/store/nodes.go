package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
)

// Nodes (cluster mode). Each edge holds a lease on its row: registering starts a new incarnation
// with a higher epoch, the epoch is the edge's fencing token, and every heartbeat and every write
// the edge makes is conditional on it. A node whose lease ran out (plus a grace period) is lost:
// its epoch moves on, so the old incarnation, should it wake up, can write nothing more.

// ErrFenced says an edge's epoch is no longer its node's: a newer incarnation registered, or the
// node was declared lost. The edge must stop and register again.
var ErrFenced = fmt.Errorf("fenced: this node's lease belongs to a newer incarnation: %w", errdefs.ErrStaleEpoch)

// Node states. They are the API's (corral.Node*; TestNodeConversion holds them equal).
const (
	NodeReady    = "ready"    // takes sandboxes
	NodeCordoned = "cordoned" // kept out of placement by an operator
	NodeDraining = "draining" // takes no sandboxes; its own end as they end
	NodeLost     = "lost"     // its lease ran out: fenced until it registers again
)

// Resources are an amount of each resource a node offers (its capacity) or its live sandboxes
// use. They are the API's corral.Resources field for field and tag for tag (the store keeps them
// in the node's document, and the cluster server serves them): a plain type conversion
// converts, and stops compiling the day a field changes on one side only.
type Resources struct {
	CPUs        float64 `json:"cpus"`
	MemoryBytes int64   `json:"memory_bytes"`
	DiskBytes   int64   `json:"disk_bytes"`
	Sandboxes   int     `json:"sandboxes"`
}

// Node is a node's row: one edge, the incarnation holding its lease, and what it reports. It is
// the API's corral.Node field for field and tag for tag (its JSON is the row's document, byte for
// byte what it was when the store kept the API's type; TestNodeConversion holds it so).
type Node struct {
	Name     string            `json:"name"`
	URL      string            `json:"url"`
	State    string            `json:"state"`
	Epoch    int64             `json:"epoch"` // this incarnation's fencing token
	Capacity Resources         `json:"capacity"`
	Used     Resources         `json:"used"`
	Labels   map[string]string `json:"labels,omitempty"`
	Tiers    []string          `json:"tiers,omitempty"`
	Runtimes []string          `json:"runtimes,omitempty"`
	// Protocol is the node protocol version the edge speaks (servers send it the caller, not
	// the user's token, from version 1 on); 0 for an edge older than the protocol.
	Protocol int `json:"protocol,omitempty"`
	// HeartbeatAt is the last heartbeat; LeaseExpiresAt when the node is lost without another.
	HeartbeatAt    time.Time `json:"heartbeat_at"`
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
	RegisteredAt   time.Time `json:"registered_at"`
}

// apiNode and nodeOf convert a node to and from the API's type, for the methods the cluster
// server calls in it (RegisterNode, ListNodes, SetNodeState).
func apiNode(n Node) model.Node {
	return model.Node{Name: n.Name, URL: n.URL, State: n.State, Epoch: n.Epoch,
		Capacity: model.Resources(n.Capacity), Used: model.Resources(n.Used),
		Labels: n.Labels, Tiers: n.Tiers, Runtimes: n.Runtimes, Protocol: n.Protocol,
		HeartbeatAt: n.HeartbeatAt, LeaseExpiresAt: n.LeaseExpiresAt, RegisteredAt: n.RegisteredAt}
}

func nodeOf(n model.Node) Node {
	return Node{Name: n.Name, URL: n.URL, State: n.State, Epoch: n.Epoch,
		Capacity: Resources(n.Capacity), Used: Resources(n.Used),
		Labels: n.Labels, Tiers: n.Tiers, Runtimes: n.Runtimes, Protocol: n.Protocol,
		HeartbeatAt: n.HeartbeatAt, LeaseExpiresAt: n.LeaseExpiresAt, RegisteredAt: n.RegisteredAt}
}

const nodeCols = `name, url, epoch, state, lease_expires_at, heartbeat_at, registered_at, doc`

func scanNode(row interface{ Scan(...any) error }) (*Node, error) {
	var n Node
	var doc string
	var lease, beat, reg int64
	if err := row.Scan(&n.Name, &n.URL, &n.Epoch, &n.State, &lease, &beat, &reg, &doc); err != nil {
		return nil, err
	}
	var body Node
	if err := json.Unmarshal([]byte(doc), &body); err != nil {
		return nil, fmt.Errorf("decode node %s: %w", n.Name, err)
	}
	n.Capacity, n.Used, n.Labels, n.Tiers, n.Runtimes, n.Protocol = body.Capacity, body.Used, body.Labels, body.Tiers, body.Runtimes, body.Protocol
	n.LeaseExpiresAt, n.HeartbeatAt, n.RegisteredAt = unixNano(lease), unixNano(beat), unixNano(reg)
	return &n, nil
}

// nodeDoc is the part of a node kept as a document: what the edge reports.
func nodeDoc(n Node) (string, error) {
	b, err := json.Marshal(Node{Capacity: n.Capacity, Used: n.Used, Labels: n.Labels, Tiers: n.Tiers, Runtimes: n.Runtimes, Protocol: n.Protocol})
	return string(b), err
}

// Register starts a new incarnation of the node n.Name (creating it on first sight) with a
// lease of ttl, and returns it with its new epoch. A cordoned or draining node stays so; a lost
// one is ready again. Of n it takes the name, URL, capacity, labels, tiers, runtimes and
// protocol version.
func (s *Store) Register(ctx context.Context, n Node, ttl time.Duration) (*Node, error) {
	doc, err := nodeDoc(n)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	var out *Node
	err = s.tx(ctx, func(tx *Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO nodes (`+nodeCols+`) VALUES (?, ?, 1, ?, ?, ?, ?, ?)
			ON CONFLICT (name) DO UPDATE SET url = excluded.url, epoch = nodes.epoch + 1,
				state = CASE WHEN nodes.state IN ('cordoned', 'draining') THEN nodes.state ELSE 'ready' END,
				lease_expires_at = excluded.lease_expires_at, heartbeat_at = excluded.heartbeat_at,
				registered_at = excluded.registered_at, doc = excluded.doc`,
			n.Name, n.URL, NodeReady, now.Add(ttl).UnixNano(), now.UnixNano(), now.UnixNano(), doc)
		if err != nil {
			return err
		}
		out, err = scanNode(tx.QueryRowContext(ctx, `SELECT `+nodeCols+` FROM nodes WHERE name = ?`, n.Name))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("register node %s: %w", n.Name, err)
	}
	return out, nil
}

// Heartbeat renews the lease of node name's incarnation epoch for ttl, records what it uses now
// and returns the node's state (an operator may have cordoned or drained it). It fails with
// ErrFenced when epoch is no longer the node's.
//
// warm are the figures of the node's warm pools by environment (nil: none), kept until the next
// heartbeat for WarmFigures.
func (s *Store) Heartbeat(ctx context.Context, name string, epoch int64, used Resources, ttl time.Duration, warm map[string]WarmFigures) (state string, err error) {
	if warm == nil {
		warm = map[string]WarmFigures{}
	}
	figures, err := json.Marshal(warm)
	if err != nil {
		return "", err
	}
	err = s.tx(ctx, func(tx *Tx) error {
		n, err := scanNode(tx.QueryRowContext(ctx, `SELECT `+nodeCols+` FROM nodes WHERE name = ?`+forUpdate(tx), name))
		if errors.Is(err, sql.ErrNoRows) {
			return ErrFenced
		} else if err != nil {
			return err
		}
		if n.Epoch != epoch || n.State == NodeLost {
			return ErrFenced
		}
		n.Used, state = used, n.State
		doc, err := nodeDoc(*n)
		if err != nil {
			return err
		}
		now := time.Now()
		_, err = tx.ExecContext(ctx, `UPDATE nodes SET lease_expires_at = ?, heartbeat_at = ?, doc = ?, warm = ? WHERE name = ? AND epoch = ?`,
			now.Add(ttl).UnixNano(), now.UnixNano(), doc, string(figures), name, epoch)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("heartbeat of node %s (epoch %d): %w", name, epoch, err)
	}
	return state, nil
}

// WarmFigures are what one node's warm pools of an environment hold and did: sandboxes ready
// and the pools' target now, and claims that found one ready (hits) of all claims since the
// edge started. They are the edge's own report (a heartbeat's), shown, never acted on.
type WarmFigures struct {
	Ready  int   `json:"ready"`
	Target int   `json:"target"`
	Hits   int64 `json:"hits"`
	Claims int64 `json:"claims"`
}

// Add adds o to f.
func (f *WarmFigures) Add(o WarmFigures) {
	f.Ready, f.Target, f.Hits, f.Claims = f.Ready+o.Ready, f.Target+o.Target, f.Hits+o.Hits, f.Claims+o.Claims
}

// WarmFigures sums, by environment, the warm pools' figures the nodes that are not lost reported
// with their last heartbeat.
func (s *Store) WarmFigures(ctx context.Context) (map[string]WarmFigures, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT name, warm FROM nodes WHERE state <> ?`, NodeLost)
	if err != nil {
		return nil, fmt.Errorf("read the warm pools' figures: %w", err)
	}
	defer rows.Close()
	out := map[string]WarmFigures{}
	for rows.Next() {
		var node, doc string
		if err := rows.Scan(&node, &doc); err != nil {
			return nil, err
		}
		var figs map[string]WarmFigures
		if err := json.Unmarshal([]byte(doc), &figs); err != nil {
			return nil, fmt.Errorf("decode the warm pools' figures of node %s: %w", node, err)
		}
		for env, f := range figs {
			sum := out[env]
			sum.Add(f)
			out[env] = sum
		}
	}
	return out, rows.Err()
}

// CheckEpoch fails with ErrFenced unless epoch is node name's current incarnation and the node is
// not lost. Writes an edge makes go through it in the same transaction.
func checkEpoch(ctx context.Context, q querier, name string, epoch int64) error {
	return lockEpoch(ctx, q, name, epoch, forUpdate(q))
}

// shareEpoch is checkEpoch with the node's row locked to share: writers of the same node's
// records run side by side, and a registration or a sweep (which update the row) waits for them
// and fences every later one.
func shareEpoch(ctx context.Context, q querier, name string, epoch int64) error {
	lock := ""
	if q.postgres() {
		lock = " FOR SHARE"
	}
	return lockEpoch(ctx, q, name, epoch, lock)
}

// lockEpoch checks the epoch of node name's row, read with lock.
func lockEpoch(ctx context.Context, q querier, name string, epoch int64, lock string) error {
	var cur int64
	var state string
	err := q.QueryRowContext(ctx, `SELECT epoch, state FROM nodes WHERE name = ?`+lock, name).Scan(&cur, &state)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && (cur != epoch || state == NodeLost)) {
		return fmt.Errorf("node %s epoch %d: %w", name, epoch, ErrFenced)
	}
	return err
}

// ListNodes returns the nodes by name, in the API's type (the cluster server serves them and
// places sandboxes on them).
func (s *Store) ListNodes(ctx context.Context) ([]model.Node, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+nodeCols+` FROM nodes ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	defer rows.Close()
	out := []model.Node{}
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, apiNode(*n))
	}
	return out, rows.Err()
}

// SetNodeState cordons, drains or uncordons (ready) a node. A lost node comes back only by
// registering again.
func (s *Store) SetNodeState(ctx context.Context, name, state string) (*model.Node, error) {
	switch state {
	case NodeReady, NodeCordoned, NodeDraining:
	default:
		return nil, errdefs.Invalid("state", "%q: want ready, cordoned or draining", state)
	}
	var out *model.Node
	err := s.tx(ctx, func(tx *Tx) error {
		n, err := scanNode(tx.QueryRowContext(ctx, `SELECT `+nodeCols+` FROM nodes WHERE name = ?`+forUpdate(tx), name))
		if errors.Is(err, sql.ErrNoRows) {
			return errdefs.NotFound("node %s", name)
		} else if err != nil {
			return err
		}
		if n.State == NodeLost {
			return errdefs.Conflict("node %s is lost; it comes back by registering again", name)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE nodes SET state = ? WHERE name = ?`, state, name); err != nil {
			return err
		}
		n.State = state
		a := apiNode(*n)
		out = &a
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("set node %s %s: %w", name, state, err)
	}
	return out, nil
}

// SweepLostNodes declares lost every node whose lease ran out more than grace ago: its epoch
// moves on (fencing the old incarnation) and its live sandboxes fail with node_lost, giving their
// quota back. It returns the nodes it declared lost and how many sandboxes failed.
func (s *Store) SweepLostNodes(ctx context.Context, grace time.Duration) ([]string, int, error) {
	var lost []string
	failed := 0
	err := s.tx(ctx, func(tx *Tx) error {
		lost, failed = nil, 0
		rows, err := tx.QueryContext(ctx, `SELECT name FROM nodes WHERE state != 'lost' AND lease_expires_at < ? ORDER BY name`+forUpdate(tx),
			time.Now().Add(-grace).UnixNano())
		if err != nil {
			return err
		}
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				rows.Close()
				return err
			}
			lost = append(lost, n)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		now := time.Now().UTC()
		for _, n := range lost {
			if _, err := tx.ExecContext(ctx, `UPDATE nodes SET state = 'lost', epoch = epoch + 1 WHERE name = ?`, n); err != nil {
				return err
			}
			srows, err := tx.QueryContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes s LEFT JOIN projects p ON p.id = s.project_id
				WHERE s.node = ? AND s.state IN `+liveStatesSQL, n)
			if err != nil {
				return err
			}
			var recs []*Sandbox
			for srows.Next() {
				var doc, pid, path string
				var activity int64
				if err := srows.Scan(&doc, &pid, &path, &activity); err != nil {
					srows.Close()
					return err
				}
				sb, err := decodeSandbox(doc, pid, path, activity)
				if err != nil {
					srows.Close()
					return err
				}
				recs = append(recs, sb)
			}
			srows.Close()
			for _, sb := range recs {
				sb.State, sb.Reason, sb.EndedAt, sb.NetSlot = model.StateFailed, model.ReasonNodeLost, now, nil
				if err := putSandbox(ctx, tx, sb); err != nil {
					return err
				}
				failed++
			}
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("sweep lost nodes: %w", err)
	}
	return lost, failed, nil
}

// NodeUsage sums what the live sandboxes of node use (their limits), for its heartbeat.
func (s *Store) NodeUsage(ctx context.Context, node string) (Resources, error) {
	var u Resources
	err := s.rdb.QueryRowContext(ctx, `SELECT COUNT(*), CAST(COALESCE(SUM(cpus), 0) AS REAL), CAST(COALESCE(SUM(memory_bytes), 0) AS BIGINT),
		CAST(COALESCE(SUM(disk_bytes), 0) AS BIGINT) FROM sandboxes WHERE node = ? AND state IN `+liveStatesSQL, node).
		Scan(&u.Sandboxes, &u.CPUs, &u.MemoryBytes, &u.DiskBytes)
	if err != nil {
		return u, fmt.Errorf("usage of node %s: %w", node, err)
	}
	return u, nil
}

// Server replicas (cluster mode). Each replica announces where edges reach its node channel
// every few seconds; edges learn the replicas alive from the join answer and every heartbeat, so
// an edge keeps its lease through any replica when the one it joined through is gone.

// AnnounceServer records that replica name is alive now and serves the node channel at nodeURL.
func (s *Store) AnnounceServer(ctx context.Context, name, nodeURL string) error {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO servers (name, node_url, seen_ns) VALUES (?, ?, ?)
		ON CONFLICT (name) DO UPDATE SET node_url = excluded.node_url, seen_ns = excluded.seen_ns`,
		name, nodeURL, time.Now().UnixNano()); err != nil {
		return fmt.Errorf("announce server %s: %w", name, err)
	}
	return nil
}

// ForgetServer removes replica name (it stops), and every replica not seen since before.
func (s *Store) ForgetServer(ctx context.Context, name string, before time.Time) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM servers WHERE name = ? OR seen_ns < ?`, name, before.UnixNano()); err != nil {
		return fmt.Errorf("forget server %s: %w", name, err)
	}
	return nil
}

// ServerURLs returns the node channel URLs of the replicas seen since since, each once, in order.
func (s *Store) ServerURLs(ctx context.Context, since time.Time) ([]string, error) {
	rows, err := s.rdb.QueryContext(ctx, `SELECT DISTINCT node_url FROM servers WHERE seen_ns >= ? AND node_url != '' ORDER BY node_url`, since.UnixNano())
	if err != nil {
		return nil, fmt.Errorf("list the servers: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var u string
		if err := rows.Scan(&u); err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, rows.Err()
}
