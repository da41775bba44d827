package store

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/lazyregexp"
	"github.com/corral-dev/corral/internal/model"
)

// Volumes. A volume row is made in state creating (its size charged to its project's disk
// quota in the same transaction), becomes ready once its node has allocated the filesystem, and
// goes with DeleteVolume, which gives the bytes back. Attachments are rows of
// volume_attachments written by AdmitSandbox in the transaction that records the sandbox, and
// removed by putSandbox when the sandbox leaves the live states: so the rule "one read-write
// attachment or any number of read-only ones" is checked and taken atomically with the create,
// and an attachment can never outlive its sandbox's record.

// The states of a volume row.
const (
	VolumeCreating = "creating"
	VolumeReady    = "ready"
)

// VolumeRecord is a volume's durable record.
type VolumeRecord struct {
	model.Volume
	ID        string
	ProjectID string
	State     string
	// Version is the version a cluster's volume was last uploaded as (0: never written), and
	// Digest that image's SHA-256 (hex). Single-node volumes stay at 0.
	Version int64
	Digest  string
}

// NewVolumeID returns a fresh volume ID.
func NewVolumeID() string {
	var b [8]byte
	rand.Read(b[:])
	return "vol-" + hex.EncodeToString(b[:])
}

var volumeIDRE = lazyregexp.New(`^vol-[0-9a-f]{16}$`)

// ValidVolumeID reports whether id is a volume's ID, as NewVolumeID makes them.
func ValidVolumeID(id string) bool { return volumeIDRE.MatchString(id) }

const volumeCols = `v.id, v.project_id, COALESCE(p.path, ''), v.name, v.size_bytes, v.node, v.state, v.created_at, v.version, v.digest`

func scanVolume(row interface{ Scan(...any) error }) (*VolumeRecord, error) {
	var v VolumeRecord
	var path string
	var created int64
	if err := row.Scan(&v.ID, &v.ProjectID, &path, &v.Name, &v.SizeBytes, &v.Node, &v.State, &created, &v.Version, &v.Digest); err != nil {
		return nil, err
	}
	v.Project = iam.Display(path)
	v.CreatedAt = time.Unix(0, created).UTC()
	return &v, nil
}

// CreateVolume records a new volume (v.State creating) if its project's and every ancestor's
// disk quota allow its size. A name taken in the project is a conflict; a refusal by a quota is
// an *iam.QuotaError naming the quota.
func (s *Store) CreateVolume(ctx context.Context, v *VolumeRecord) error {
	err := s.tx(ctx, func(tx *Tx) error {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM volumes WHERE project_id = ? AND name = ?`, v.ProjectID, v.Name).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return errdefs.Conflict("volume %s already exists in project %s", v.Name, v.Project)
		}
		if _, err := checkQuotas(ctx, tx, v.ProjectID, model.Usage{DiskBytes: v.SizeBytes}, time.Now()); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO volumes (id, project_id, name, size_bytes, node, state, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			v.ID, v.ProjectID, v.Name, v.SizeBytes, v.Node, v.State, v.CreatedAt.UnixNano()); err != nil {
			if isUnique(err) {
				return errdefs.Conflict("volume %s already exists in project %s", v.Name, v.Project)
			}
			return err
		}
		return chargeVolume(ctx, tx, v.ProjectID, v.SizeBytes)
	})
	if qe, ok := errors.AsType[*iam.QuotaError](err); ok {
		return qe
	}
	if err != nil {
		return fmt.Errorf("create volume %s: %w", v.Name, err)
	}
	return nil
}

// chargeVolume adds size bytes (negative: gives them back) to the disk usage of the project
// with this ID and of its ancestors.
func chargeVolume(ctx context.Context, q querier, projectID string, size int64) error {
	ids, err := ancestorIDs(ctx, q, projectID)
	if err != nil {
		return err
	}
	return addUsageTo(ctx, q, ids, model.Usage{DiskBytes: size})
}

// SetVolumeState sets the state of the volume with this ID.
func (s *Store) SetVolumeState(ctx context.Context, id, state string) error {
	_, err := s.db.ExecContext(ctx, `UPDATE volumes SET state = ? WHERE id = ?`, state, id)
	if err != nil {
		return fmt.Errorf("set volume %s %s: %w", id, state, err)
	}
	return nil
}

// GetVolume returns the volume name of the project with this ID, with its attachments.
func (s *Store) GetVolume(ctx context.Context, projectID, name string) (*VolumeRecord, error) {
	v, err := scanVolume(s.rdb.QueryRowContext(ctx, `SELECT `+volumeCols+` FROM volumes v LEFT JOIN projects p ON p.id = v.project_id
		WHERE v.project_id = ? AND v.name = ?`, projectID, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.NotFound("volume %s", name)
	}
	if err != nil {
		return nil, fmt.Errorf("get volume %s: %w", name, err)
	}
	return v, s.fillAttachments(ctx, []*VolumeRecord{v})
}

// ListVolumes returns the volumes of the project at path (canonical) and its subtree, by
// project and name; node, when set, keeps those of that node only.
func (s *Store) ListVolumes(ctx context.Context, path, node string) ([]*VolumeRecord, error) {
	cond, args := subtreeCond("p.path", path)
	if node != "" {
		cond += ` AND v.node = ?`
		args = append(args, node)
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT `+volumeCols+` FROM volumes v JOIN projects p ON p.id = v.project_id
		WHERE `+cond+` ORDER BY p.path, v.name`, args...)
	if err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	var out []*VolumeRecord
	for rows.Next() {
		v, err := scanVolume(rows)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("list volumes: %w", err)
		}
		out = append(out, v)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list volumes: %w", err)
	}
	return out, s.fillAttachments(ctx, out)
}

// fillAttachments reads the attachments of vs.
func (s *Store) fillAttachments(ctx context.Context, vs []*VolumeRecord) error {
	if len(vs) == 0 {
		return nil
	}
	byID := make(map[string]*VolumeRecord, len(vs))
	args := make([]any, 0, len(vs))
	for _, v := range vs {
		byID[v.ID] = v
		args = append(args, v.ID)
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT volume_id, sandbox_id, read_only FROM volume_attachments WHERE volume_id IN (?`+
		strings.Repeat(", ?", len(args)-1)+`) ORDER BY sandbox_id`, args...)
	if err != nil {
		return fmt.Errorf("read volume attachments: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var vid string
		var a model.VolumeAttachment
		var ro int
		if err := rows.Scan(&vid, &a.Sandbox, &ro); err != nil {
			return fmt.Errorf("read volume attachments: %w", err)
		}
		a.ReadOnly = ro != 0
		byID[vid].AttachedTo = append(byID[vid].AttachedTo, a)
	}
	return rows.Err()
}

// DeleteVolume deletes the volume with this ID and gives its bytes back to its project's quota;
// refused (conflict) while a sandbox has it attached. It returns the deleted record.
func (s *Store) DeleteVolume(ctx context.Context, id string) (*VolumeRecord, error) {
	var v *VolumeRecord
	err := s.tx(ctx, func(tx *Tx) error {
		var err error
		// Locked first (PostgreSQL): an attachment racing with the deletion takes turns with it.
		var state string
		if err := tx.QueryRowContext(ctx, `SELECT state FROM volumes WHERE id = ?`+forUpdate(tx), id).Scan(&state); errors.Is(err, sql.ErrNoRows) {
			return errdefs.NotFound("volume %s", id)
		} else if err != nil {
			return err
		}
		v, err = scanVolume(tx.QueryRowContext(ctx, `SELECT `+volumeCols+` FROM volumes v LEFT JOIN projects p ON p.id = v.project_id
			WHERE v.id = ?`, id))
		if errors.Is(err, sql.ErrNoRows) {
			return errdefs.NotFound("volume %s", id)
		} else if err != nil {
			return err
		}
		var sb string
		err = tx.QueryRowContext(ctx, `SELECT sandbox_id FROM volume_attachments WHERE volume_id = ? ORDER BY sandbox_id LIMIT 1`, id).Scan(&sb)
		if err == nil {
			return errdefs.Conflict("volume %s is attached to sandbox %s; delete that sandbox first", v.Name, sb)
		} else if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM volumes WHERE id = ?`, id); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM volume_copies WHERE volume_id = ?`, id); err != nil {
			return err
		}
		return chargeVolume(ctx, tx, v.ProjectID, -v.SizeBytes)
	})
	if err != nil {
		return nil, fmt.Errorf("delete volume: %w", err)
	}
	return v, nil
}

// attachVolumes records sb's volume attachments (sb.VolumeIDs, in the order of sb.Volumes),
// refusing (conflict) a volume that is gone, not ready, or attached in a way the new attachment
// may not share: a read-write attachment excludes every other.
func attachVolumes(ctx context.Context, tx *Tx, sb *Sandbox) error {
	if len(sb.VolumeIDs) != len(sb.Volumes) {
		return fmt.Errorf("sandbox %s: %d volume IDs for %d volumes", sb.ID, len(sb.VolumeIDs), len(sb.Volumes))
	}
	for i, id := range sb.VolumeIDs {
		m := sb.Volumes[i]
		var state, project string
		// FOR UPDATE (PostgreSQL): concurrent attachments of one volume take turns.
		err := tx.QueryRowContext(ctx, `SELECT state, project_id FROM volumes WHERE id = ?`+forUpdate(tx), id).Scan(&state, &project)
		if errors.Is(err, sql.ErrNoRows) {
			return errdefs.Conflict("volume %s was deleted meanwhile", m.Name)
		} else if err != nil {
			return err
		}
		if project != sb.ProjectID {
			// A sandbox mounts the volumes of its own project only (the edge resolved the
			// names there): anything else is a broken or stolen edge.
			return fmt.Errorf("volume %s (%s) is not of the project of sandbox %s: %w", m.Name, id, sb.ID, errdefs.ErrDenied)
		}
		if state != VolumeReady {
			return errdefs.Conflict("volume %s is still being made; try again", m.Name)
		}
		var other string
		var ro int
		err = tx.QueryRowContext(ctx, `SELECT sandbox_id, read_only FROM volume_attachments WHERE volume_id = ? ORDER BY read_only, sandbox_id LIMIT 1`, id).
			Scan(&other, &ro)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return err
		case ro == 0:
			return errdefs.Conflict("volume %s is attached read-write to sandbox %s; a read-write volume has one sandbox at a time", m.Name, other)
		case !m.ReadOnly:
			return errdefs.Conflict("volume %s is attached read-only to sandbox %s; a read-write attachment needs the volume to itself", m.Name, other)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO volume_attachments (volume_id, sandbox_id, read_only) VALUES (?, ?, ?)`,
			id, sb.ID, boolInt(m.ReadOnly)); err != nil {
			return err
		}
	}
	return nil
}

// detachVolumes removes the attachments of the sandbox with this ID.
func detachVolumes(ctx context.Context, q querier, sandboxID string) error {
	_, err := q.ExecContext(ctx, `DELETE FROM volume_attachments WHERE sandbox_id = ?`, sandboxID)
	return err
}

// recountVolumes adds every volume's size to its project's usage (RecountUsage).
func recountVolumes(ctx context.Context, tx *Tx) error {
	rows, err := tx.QueryContext(ctx, `SELECT project_id, size_bytes FROM volumes`)
	if err != nil {
		return err
	}
	type charge struct {
		project string
		size    int64
	}
	var all []charge
	for rows.Next() {
		var c charge
		if err := rows.Scan(&c.project, &c.size); err != nil {
			rows.Close()
			return err
		}
		all = append(all, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, c := range all {
		if err := chargeVolume(ctx, tx, c.project, c.size); err != nil {
			return err
		}
	}
	return nil
}

// Volumes in a cluster. A volume's image lives in the blob store, one object per version; the
// row's version and digest name the current one. Only the sandbox holding the read-write
// attachment may move it on (CommitVolumeVersion), and only from the version it attached at,
// so a writer fenced off (its node declared lost, its attachment released) cannot overwrite
// what came after. volume_copies says which node caches which version, for placement.

// GetVolumeByID returns the volume with this ID, with its attachments.
func (s *Store) GetVolumeByID(ctx context.Context, id string) (*VolumeRecord, error) {
	v, err := s.volumeByID(ctx, id)
	if err != nil {
		return nil, err
	}
	return v, s.fillAttachments(ctx, []*VolumeRecord{v})
}

// volumeByID returns the volume with this ID, without its attachments.
func (s *Store) volumeByID(ctx context.Context, id string) (*VolumeRecord, error) {
	v, err := scanVolume(s.rdb.QueryRowContext(ctx, `SELECT `+volumeCols+` FROM volumes v LEFT JOIN projects p ON p.id = v.project_id
		WHERE v.id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.NotFound("volume %s", id)
	}
	if err != nil {
		return nil, fmt.Errorf("get volume %s: %w", id, err)
	}
	return v, nil
}

// CommitVolumeVersion records version (from-1 is the one the writer attached at) with its
// digest as volume id's current image, and node as holding it, if sandbox still has the
// volume attached read-write and the volume is still at from-1. Otherwise it is a conflict
// and nothing changes.
func (s *Store) CommitVolumeVersion(ctx context.Context, id, sandbox, node string, version int64, digest string) error {
	err := s.tx(ctx, func(tx *Tx) error { return commitVolume(ctx, tx, id, sandbox, node, version, digest) })
	if err != nil {
		return fmt.Errorf("commit volume %s version %d: %w", id, version, err)
	}
	return nil
}

func commitVolume(ctx context.Context, tx *Tx, id, sandbox, node string, version int64, digest string) error {
	res, err := tx.ExecContext(ctx, `UPDATE volumes SET version = ?, digest = ? WHERE id = ? AND version = ?
		AND EXISTS (SELECT 1 FROM volume_attachments a WHERE a.volume_id = ? AND a.sandbox_id = ? AND a.read_only = 0)`,
		version, digest, id, version-1, id, sandbox)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return errdefs.Conflict("volume %s is no longer attached read-write to sandbox %s at version %d", id, sandbox, version-1)
	}
	return putVolumeCopy(ctx, tx, id, node, version)
}

// Volumes on a cluster's node: what an edge reads and records of its sandboxes' volumes
// through the node channel. Each call names the sandbox it acts for, which must be the node's
// and have the volume attached (read-write for a commit); writes check the node's epoch in
// their transaction, so a fenced incarnation records nothing.

// NodeVolume returns volume id as node's sandbox, which has it attached, sees it: its size and
// its current version and digest (no attachments: those name other nodes' sandboxes).
func (s *Store) NodeVolume(ctx context.Context, node, sandbox, id string) (*VolumeRecord, error) {
	if err := attachedOnNode(ctx, s.rdb, node, sandbox, id, false); err != nil {
		return nil, fmt.Errorf("volume %s of node %s: %w", id, node, err)
	}
	return s.volumeByID(ctx, id)
}

// CommitNodeVolume is CommitVolumeVersion for node's incarnation epoch, whose sandbox is the
// volume's writer.
func (s *Store) CommitNodeVolume(ctx context.Context, node string, epoch int64, sandbox, id string, version int64, digest string) error {
	err := s.tx(ctx, func(tx *Tx) error {
		if err := shareEpoch(ctx, tx, node, epoch); err != nil {
			return err
		}
		if err := attachedOnNode(ctx, tx, node, sandbox, id, true); err != nil {
			return err
		}
		return commitVolume(ctx, tx, id, sandbox, node, version, digest)
	})
	if err != nil {
		return fmt.Errorf("commit volume %s version %d of node %s: %w", id, version, node, err)
	}
	return nil
}

// SetNodeVolumeCopy is SetVolumeCopy for node's incarnation epoch, fetching the volume for its
// sandbox.
func (s *Store) SetNodeVolumeCopy(ctx context.Context, node string, epoch int64, sandbox, id string, version int64) error {
	err := s.tx(ctx, func(tx *Tx) error {
		if err := shareEpoch(ctx, tx, node, epoch); err != nil {
			return err
		}
		if err := attachedOnNode(ctx, tx, node, sandbox, id, false); err != nil {
			return err
		}
		return putVolumeCopy(ctx, tx, id, node, version)
	})
	if err != nil {
		return fmt.Errorf("record volume %s's copy on %s: %w", id, node, err)
	}
	return nil
}

// attachedOnNode fails unless sandbox is node's and has volume id attached (read-write, with
// writer): denied for another node's sandbox, a conflict when it has the volume no (longer) so.
func attachedOnNode(ctx context.Context, q querier, node, sandbox, id string, writer bool) error {
	var owner string
	var readOnly int
	err := q.QueryRowContext(ctx, `SELECT s.node, a.read_only FROM volume_attachments a JOIN sandboxes s ON s.id = a.sandbox_id
		WHERE a.volume_id = ? AND a.sandbox_id = ?`, id, sandbox).Scan(&owner, &readOnly)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return errdefs.Conflict("volume %s is not attached to sandbox %s", id, sandbox)
	case err != nil:
		return err
	case owner != node:
		return fmt.Errorf("sandbox %s is node %s's, not %s's: %w", sandbox, owner, node, errdefs.ErrDenied)
	case writer && readOnly != 0:
		return errdefs.Conflict("volume %s is attached to sandbox %s read-only", id, sandbox)
	}
	return nil
}

// MaxVolumeVersions bounds the IDs of one VolumeVersions call.
const MaxVolumeVersions = 1000

// VolumeVersions returns the current version of each volume of ids that exists (at most
// MaxVolumeVersions): an edge's start asks which of the volumes it finds cached or in the blob
// store are still there, and at which version.
func (s *Store) VolumeVersions(ctx context.Context, ids []string) (map[string]int64, error) {
	out := make(map[string]int64, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	if len(ids) > MaxVolumeVersions {
		return nil, errdefs.Invalid("ids", "%d volume IDs: at most %d a call", len(ids), MaxVolumeVersions)
	}
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT id, version FROM volumes WHERE id IN (?`+strings.Repeat(", ?", len(ids)-1)+`)`, args...)
	if err != nil {
		return nil, fmt.Errorf("read volume versions: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var v int64
		if err := rows.Scan(&id, &v); err != nil {
			return nil, fmt.Errorf("read volume versions: %w", err)
		}
		out[id] = v
	}
	return out, rows.Err()
}

// SetVolumeCopy records that node caches version of volume id (version < 0: caches none).
func (s *Store) SetVolumeCopy(ctx context.Context, id, node string, version int64) error {
	if err := putVolumeCopy(ctx, s.db, id, node, version); err != nil {
		return fmt.Errorf("record volume %s's copy on %s: %w", id, node, err)
	}
	return nil
}

func putVolumeCopy(ctx context.Context, q querier, id, node string, version int64) error {
	if _, err := q.ExecContext(ctx, `DELETE FROM volume_copies WHERE volume_id = ? AND node = ?`, id, node); err != nil {
		return err
	}
	if version < 0 {
		return nil
	}
	_, err := q.ExecContext(ctx, `INSERT INTO volume_copies (volume_id, node, version) VALUES (?, ?, ?)`, id, node, version)
	return err
}

// VolumeCopyNodes returns the nodes that cache the current version of the most of the named
// volumes of the project at path (canonical), best first; none when no node caches any.
func (s *Store) VolumeCopyNodes(ctx context.Context, path string, names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	args := []any{path}
	for _, n := range names {
		args = append(args, n)
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT c.node, COUNT(*) FROM volume_copies c
		JOIN volumes v ON v.id = c.volume_id AND v.version = c.version
		JOIN projects p ON p.id = v.project_id
		WHERE p.path = ? AND v.name IN (?`+strings.Repeat(", ?", len(names)-1)+`)
		GROUP BY c.node ORDER BY COUNT(*) DESC, c.node`, args...)
	if err != nil {
		return nil, fmt.Errorf("find the nodes caching volumes: %w", err)
	}
	defer rows.Close()
	var out []string
	best := -1
	for rows.Next() {
		var node string
		var n int
		if err := rows.Scan(&node, &n); err != nil {
			return nil, fmt.Errorf("find the nodes caching volumes: %w", err)
		}
		if best >= 0 && n < best {
			break
		}
		best = n
		out = append(out, node)
	}
	return out, rows.Err()
}
