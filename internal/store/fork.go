package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
)

// AdmitSandboxes is AdmitSandbox for several sandboxes of one project at once (the copies of a
// fork), all or nothing: their sum is checked against the quotas of the project and its
// ancestors, and either every record is written or none. They take no idempotency key and
// no volumes. Like AdmitSandbox, it runs to its end when ctx ends.
func (s *Store) AdmitSandboxes(ctx context.Context, sbs []*Sandbox) error {
	return s.admitSandboxes(ctx, nil, sbs)
}

// AdmitNodeSandboxes is AdmitSandboxes for node's sandboxes, as node's incarnation epoch asks
// for them (AdmitNodeSandbox's checks, for each). Copies this incarnation admitted already (an
// answer that broke off, asked again) are admitted: the call is idempotent.
func (s *Store) AdmitNodeSandboxes(ctx context.Context, node string, epoch int64, sbs []*Sandbox) error {
	fence, err := nodeFence(ctx, node, epoch, sbs)
	if err != nil {
		return err
	}
	return admittedOnce(s.admitSandboxes(ctx, fence, sbs))
}

// admitSandboxes is AdmitSandboxes with fence, the check that the writer may still write, run
// first in the transaction.
func (s *Store) admitSandboxes(ctx context.Context, fence func(*Tx) error, sbs []*Sandbox) error {
	ctx = context.WithoutCancel(ctx)
	if len(sbs) == 0 {
		return nil
	}
	projectID := sbs[0].ProjectID
	if projectID == "" {
		projectID = RootProjectID
	}
	want := model.Usage{Tiers: map[string]int64{}}
	for _, sb := range sbs {
		if sb.ProjectID == "" {
			sb.ProjectID = RootProjectID
		}
		if sb.ProjectID != projectID {
			return fmt.Errorf("admit sandboxes: %s is in another project than %s", sb.ID, sbs[0].ID)
		}
		if len(sb.VolumeIDs) > 0 {
			return fmt.Errorf("admit sandboxes: %s has volumes", sb.ID)
		}
		want.Sandboxes++
		want.CPUs += sb.Limits.CPUs
		want.MemoryBytes += sb.Limits.MemoryBytes
		want.DiskBytes += sb.Limits.DiskBytes
		want.CreatesPerMinute++
		want.Tiers[sb.Tier]++
	}
	err := s.tx(ctx, func(tx *Tx) error {
		if err := runFence(fence, tx); err != nil {
			return err
		}
		now := time.Now()
		limited, err := checkQuotas(ctx, tx, projectID, want, now)
		if err != nil {
			return err
		}
		for i := len(limited) - 1; i >= 0; i-- {
			for range sbs {
				if err := takeCreation(ctx, tx, limited[i], now); err != nil {
					return err
				}
			}
		}
		for _, sb := range sbs {
			if err := insertSandbox(ctx, tx, sb); err != nil {
				return err
			}
		}
		return nil
	})
	if qe, ok := errors.AsType[*iam.QuotaError](err); ok {
		return qe
	}
	if err != nil {
		return fmt.Errorf("admit %d sandboxes: %w", len(sbs), err)
	}
	return nil
}
