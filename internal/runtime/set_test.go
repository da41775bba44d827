package runtime

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

// memBackend is a backend in memory: it runs the runtimes it is named for, and pauses only
// when pauser is set.
type memBackend struct {
	names []string
	ids   map[string]bool
}

func (m *memBackend) Runtimes() []string { return m.names }
func (m *memBackend) Available(name string) error {
	if slices.Contains(m.names, name) {
		return nil
	}
	return errdefs.Unavailable("no %s", name)
}
func (m *memBackend) Has(id string) bool { return m.ids[id] }
func (m *memBackend) Create(ctx context.Context, s Spec) (*Sandbox, error) {
	m.ids[s.ID] = true
	return &Sandbox{ID: s.ID, AgentSocket: m.names[0]}, nil
}
func (m *memBackend) Open(ctx context.Context, id string) (*Sandbox, error) {
	if !m.ids[id] {
		return nil, errdefs.NotFound("sandbox %s", id)
	}
	return &Sandbox{ID: id, AgentSocket: m.names[0]}, nil
}
func (m *memBackend) Status(ctx context.Context, id string) (Status, error) {
	if !m.ids[id] {
		return Status{}, errdefs.NotFound("sandbox %s", id)
	}
	return Status{State: StateRunning}, nil
}
func (m *memBackend) Delete(ctx context.Context, id string) error { delete(m.ids, id); return nil }
func (m *memBackend) Kill(ctx context.Context, id string) error   { return nil }
func (m *memBackend) List(ctx context.Context) ([]string, error) {
	var ids []string
	for id := range m.ids {
		ids = append(ids, id)
	}
	return ids, nil
}
func (m *memBackend) Close() error { return nil }

// pausingBackend adds Pauser.
type pausingBackend struct{ memBackend }

func (p *pausingBackend) Pause(ctx context.Context, id string) (PauseStats, error) {
	return PauseStats{MemoryBefore: 7}, nil
}
func (p *pausingBackend) Resume(ctx context.Context, id string) (ResumeStats, error) {
	return ResumeStats{}, nil
}

func TestSetRoutes(t *testing.T) {
	ctx := context.Background()
	ct := &memBackend{names: []string{"runc", "gvisor"}, ids: map[string]bool{}}
	vm := &pausingBackend{memBackend{names: []string{"qemu"}, ids: map[string]bool{}}}
	s, err := NewSet(ct, vm)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ id, runtime, want string }{{"a", "", "runc"}, {"b", "gvisor", "runc"}, {"c", "qemu", "qemu"}} {
		sb, err := s.Create(ctx, Spec{ID: c.id, Runtime: c.runtime})
		if err != nil || sb.AgentSocket != c.want {
			t.Errorf("Create(%s, runtime %q) = %+v, %v; want it on %s", c.id, c.runtime, sb, err, c.want)
		}
		if sb, err := s.Open(ctx, c.id); err != nil || sb.AgentSocket != c.want {
			t.Errorf("Open(%s) = %+v, %v; want it on %s", c.id, sb, err, c.want)
		}
	}
	if _, err := s.Create(ctx, Spec{ID: "d", Runtime: "firecracker"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("Create on a runtime no backend runs: %v; want invalid", err)
	}
	if _, err := s.Status(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Status of an unknown sandbox: %v; want not found (from the default backend)", err)
	}
	if ids, err := s.List(ctx); err != nil || !slices.Equal(ids, []string{"a", "b", "c"}) {
		t.Errorf("List = %v, %v; want a b c", ids, err)
	}
	if st, err := s.Pause(ctx, "c"); err != nil || st.MemoryBefore != 7 {
		t.Errorf("Pause of a VM = %+v, %v; want the VM backend's", st, err)
	}
	if _, err := s.Pause(ctx, "a"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Pause on a backend without Pauser: %v; want unavailable", err)
	}
	if _, _, _, err := s.Screen(ctx, "c"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Screen on a backend without Machine: %v; want conflict", err)
	}
	if err := s.MachineAvailable(); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("MachineAvailable with no Machine backend: %v; want unavailable", err)
	}
	if err := s.Available("gvisor"); err != nil {
		t.Errorf("Available(gvisor) = %v", err)
	}
	if err := s.Available("firecracker"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Available(firecracker) = %v; want unavailable", err)
	}
	if got := s.Backend("qemu"); got != Runtime(vm) {
		t.Errorf("Backend(qemu) = %v; want the VM backend", got)
	}
	if _, err := NewSet(ct, &memBackend{names: []string{"gvisor"}}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("NewSet with gvisor twice: %v; want conflict", err)
	}
}
