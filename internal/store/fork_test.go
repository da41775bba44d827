package store

import (
	"context"
	"errors"
	"testing"

	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
)

// TestAdmitSandboxesAllOrNothing: copies of a fork are admitted together: a quota that admits
// fewer than all of them writes none, one that admits them all writes every record, and the
// creation rate is taken once per copy.
func TestAdmitSandboxesAllOrNothing(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		s := open(t)
		p := mustProject(t, s, "p")
		if _, err := s.SetQuota(ctx, "p", model.Quota{Sandboxes: ptr[int64](3), CreatesPerMinute: ptr[int64](5)}); err != nil {
			t.Fatal(err)
		}
		first := newRecord(p.ID, 0)
		if err := s.AdmitSandbox(ctx, first, nil); err != nil {
			t.Fatal(err)
		}
		three := []*Sandbox{newRecord(p.ID, 0), newRecord(p.ID, 0), newRecord(p.ID, 0)}
		var qe *iam.QuotaError
		if err := s.AdmitSandboxes(ctx, three); !errors.As(err, &qe) || qe.Resource != "sandboxes" || qe.Request != 3 {
			t.Fatalf("3 copies with room for 2: %v, want a sandboxes quota error asking 3", err)
		}
		for _, r := range three {
			if _, err := s.GetSandbox(ctx, r.ID); err == nil {
				t.Fatalf("refused copy %s was written", r.ID)
			}
		}
		two := three[:2]
		if err := s.AdmitSandboxes(ctx, two); err != nil {
			t.Fatalf("2 copies with room for 2: %v", err)
		}
		for _, r := range two {
			if _, err := s.GetSandbox(ctx, r.ID); err != nil {
				t.Fatalf("admitted copy %s: %v", r.ID, err)
			}
		}
		// 3 creations so far of 5 a minute: two more fit, after stopping the live ones.
		for _, r := range append(two, first) {
			r.State = model.StateStopped
			if err := s.PutSandbox(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.AdmitSandboxes(ctx, []*Sandbox{newRecord(p.ID, 0), newRecord(p.ID, 0), newRecord(p.ID, 0)}); !errors.As(err, &qe) || qe.Resource != "creates_per_minute" {
			t.Fatalf("3 copies over the creation rate: %v", err)
		}
	})
}
