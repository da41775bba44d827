package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/placement"
)

// Project placement: the node groups a project's sandboxes are pinned to or kept off (cluster
// mode). A project's own placement is stored with it; the one in effect for its sandboxes is the
// Pin of the nearest project on the way up to the root that sets one, and every Avoid on the way.

// ValidatePlacement checks a placement's selectors.
func ValidatePlacement(p model.ProjectPlacement) error {
	if err := placement.ValidateSelectors("pin", p.Pin); err != nil {
		return err
	}
	return placement.ValidateSelectors("avoid", p.Avoid)
}

// SetProjectPlacement sets the placement of the project at path and returns it with the one in
// effect.
func (s *Store) SetProjectPlacement(ctx context.Context, path string, p model.ProjectPlacement) (*model.ProjectPlacement, error) {
	if err := ValidatePlacement(p); err != nil {
		return nil, err
	}
	doc, err := json.Marshal(model.ProjectPlacement{Pin: p.Pin, Avoid: p.Avoid})
	if err != nil {
		return nil, err
	}
	res, err := s.db.ExecContext(ctx, `UPDATE projects SET placement = ? WHERE path = ?`, string(doc), path)
	if err != nil {
		return nil, fmt.Errorf("set placement of project %s: %w", iam.Display(path), err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, errNoProject(path)
	}
	return s.ProjectPlacement(ctx, path)
}

// ProjectPlacement returns the placement of the project at path, with the one in effect.
func (s *Store) ProjectPlacement(ctx context.Context, path string) (*model.ProjectPlacement, error) {
	anc := iam.Ancestors(path) // root first, path last
	args := make([]any, len(anc))
	for i, a := range anc {
		args[i] = a
	}
	rows, err := s.rdb.QueryContext(ctx, `SELECT path, placement FROM projects WHERE path IN (?`+strings.Repeat(", ?", len(anc)-1)+`)`, args...)
	if err != nil {
		return nil, fmt.Errorf("read placement of project %s: %w", iam.Display(path), err)
	}
	defer rows.Close()
	byPath := map[string]model.ProjectPlacement{}
	for rows.Next() {
		var p, doc string
		if err := rows.Scan(&p, &doc); err != nil {
			return nil, err
		}
		var pl model.ProjectPlacement
		if err := json.Unmarshal([]byte(doc), &pl); err != nil {
			return nil, fmt.Errorf("decode placement of project %s: %w", iam.Display(p), err)
		}
		byPath[p] = pl
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	own, ok := byPath[path]
	if !ok {
		return nil, errNoProject(path)
	}
	eff := &model.ProjectPlacement{Pin: []map[string]string{}, Avoid: []map[string]string{}}
	for _, a := range anc {
		pl := byPath[a]
		if len(pl.Pin) > 0 {
			eff.Pin = pl.Pin
		}
		eff.Avoid = append(eff.Avoid, pl.Avoid...)
	}
	out := &model.ProjectPlacement{Project: iam.Display(path), Pin: own.Pin, Avoid: own.Avoid, Effective: eff}
	if out.Pin == nil {
		out.Pin = []map[string]string{}
	}
	if out.Avoid == nil {
		out.Avoid = []map[string]string{}
	}
	return out, nil
}

func errNoProject(path string) error { return errdefs.NotFound("project %s", iam.Display(path)) }
