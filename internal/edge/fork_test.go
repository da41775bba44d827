package edge

import (
	"errors"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// TestForkable: which running sources a fork takes, and the copy's hostname: a microvm's copy
// is named after its own ID (its guest is told after the restore), a gVisor one with
// processes keeps its source's.
func TestForkable(t *testing.T) {
	for _, tc := range []struct {
		tier, runtime string
		diskOnly      bool
		want          string // "" when forkable, else a word of the 409
	}{
		{TierContainer, RuntimeGVisor, false, ""},
		{TierContainer, RuntimeRunc, true, ""},
		{TierContainer, RuntimeRunc, false, "disk_only"},
		{TierMicroVM, RuntimeQEMU, false, ""},
		{TierMicroVM, RuntimeQEMU, true, ""},
		{TierVM, RuntimeQEMU, false, "vm sandbox"},
		{TierFncall, RuntimeRunc, true, "fncall"},
	} {
		src := &store.Sandbox{Sandbox: model.Sandbox{ID: "sb-src", Tier: tc.tier, Runtime: tc.runtime, State: model.StateRunning, Hostname: "sb-src"}}
		err := forkable(src, newSandbox(src, ""), tc.diskOnly)
		if tc.want == "" && err != nil || tc.want != "" && (!errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s/%s disk_only=%v: %v, want %q", tc.tier, tc.runtime, tc.diskOnly, err, tc.want)
		}
	}
	for _, tc := range []struct {
		tier, runtime string
		memory        bool
		want          string
	}{
		{TierContainer, RuntimeGVisor, true, "sb-src"},
		{TierContainer, RuntimeGVisor, false, "sb-copy"},
		{TierMicroVM, RuntimeQEMU, true, "sb-copy"},
		{TierMicroVM, RuntimeQEMU, false, "sb-copy"},
	} {
		src := &store.Sandbox{Sandbox: model.Sandbox{ID: "sb-src", Tier: tc.tier, Runtime: tc.runtime, Hostname: "sb-src"}}
		if got := forkRecord(src, "sb-copy", nil, tc.memory, src.CreatedAt).Hostname; got != tc.want {
			t.Errorf("%s/%s memory=%v: copy's hostname %q, want %q", tc.tier, tc.runtime, tc.memory, got, tc.want)
		}
	}
}
