package runtime

import (
	"context"
	"errors"
	"net"
	"slices"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Set is the node's backends as one Runtime: Create goes to the backend that runs
// Spec.Runtime, every other call to the backend that has the sandbox (the first backend when
// none claims it, so an unknown ID gets its NotFound). Optional operations are forwarded when
// that backend implements them and are errdefs.ErrUnavailable otherwise, so Set implements
// every interface of this package. A Set is immutable and safe for concurrent use.
type Set struct {
	backends []Runtime
	byName   map[string]Runtime
}

// NewSet returns a Set of backends, the first the default (it runs a Spec without Runtime).
// A runtime name served by two backends is an error.
func NewSet(backends ...Runtime) (*Set, error) {
	if len(backends) == 0 {
		return nil, errors.New("runtime set: no backends")
	}
	s := &Set{backends: backends, byName: map[string]Runtime{}}
	for _, b := range backends {
		for _, n := range b.Runtimes() {
			if _, dup := s.byName[n]; dup {
				return nil, errdefs.Conflict("runtime set: two backends run %q", n)
			}
			s.byName[n] = b
		}
	}
	return s, nil
}

// by returns the backend that has id.
func (s *Set) by(id string) Runtime {
	for _, b := range s.backends[1:] {
		if b.Has(id) {
			return b
		}
	}
	return s.backends[0]
}

// Runtimes lists every backend's runtimes, in the order of the backends.
func (s *Set) Runtimes() []string {
	var out []string
	for _, b := range s.backends {
		out = append(out, b.Runtimes()...)
	}
	return out
}

// Available asks the backend that runs name.
func (s *Set) Available(name string) error {
	b, ok := s.byName[name]
	if !ok {
		return errdefs.Unavailable("no backend on this node runs %q", name)
	}
	return b.Available(name)
}

// Has reports whether any backend has id.
func (s *Set) Has(id string) bool {
	return slices.ContainsFunc(s.backends, func(b Runtime) bool { return b.Has(id) })
}

// Create creates the sandbox on the backend that runs spec.Runtime.
func (s *Set) Create(ctx context.Context, spec Spec) (*Sandbox, error) {
	b := s.backends[0]
	if spec.Runtime != "" {
		var ok bool
		if b, ok = s.byName[spec.Runtime]; !ok {
			return nil, errdefs.Invalid("Runtime", "%q: no backend on this node runs it (have %v)", spec.Runtime, s.Runtimes())
		}
	}
	return b.Create(ctx, spec)
}

func (s *Set) Open(ctx context.Context, id string) (*Sandbox, error) { return s.by(id).Open(ctx, id) }

func (s *Set) Status(ctx context.Context, id string) (Status, error) {
	return s.by(id).Status(ctx, id)
}

func (s *Set) Delete(ctx context.Context, id string) error { return s.by(id).Delete(ctx, id) }

func (s *Set) Kill(ctx context.Context, id string) error { return s.by(id).Kill(ctx, id) }

// List merges every backend's sandboxes (sorted, once each); a backend's error does not hide
// the others' sandboxes.
func (s *Set) List(ctx context.Context) ([]string, error) {
	var ids []string
	var errs []error
	for _, b := range s.backends {
		l, err := b.List(ctx)
		ids = append(ids, l...)
		errs = append(errs, err)
	}
	slices.Sort(ids)
	return slices.Compact(ids), errors.Join(errs...)
}

// Close closes every backend.
func (s *Set) Close() error {
	var errs []error
	for _, b := range s.backends {
		errs = append(errs, b.Close())
	}
	return errors.Join(errs...)
}

// Backends returns the backends that implement T (e.g. Machine), in order.
func Backends[T any](s *Set) []T {
	var out []T
	for _, b := range s.backends {
		if t, ok := b.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// lacks is the error for an optional operation id's backend does not do.
func lacks(id, what string) error {
	return errdefs.Unavailable("the runtime of sandbox %s cannot %s", id, what)
}

func (s *Set) Pause(ctx context.Context, id string) (PauseStats, error) {
	if p, ok := s.by(id).(Pauser); ok {
		return p.Pause(ctx, id)
	}
	return PauseStats{}, lacks(id, "pause")
}

func (s *Set) Resume(ctx context.Context, id string) (ResumeStats, error) {
	if p, ok := s.by(id).(Pauser); ok {
		return p.Resume(ctx, id)
	}
	return ResumeStats{}, lacks(id, "resume")
}

func (s *Set) Freeze(ctx context.Context, id string) error {
	if p, ok := s.by(id).(Snapshotter); ok {
		return p.Freeze(ctx, id)
	}
	return lacks(id, "freeze")
}

func (s *Set) Thaw(ctx context.Context, id string) error {
	if p, ok := s.by(id).(Snapshotter); ok {
		return p.Thaw(ctx, id)
	}
	return lacks(id, "thaw")
}

func (s *Set) UpperDir(id string) (string, error) {
	if p, ok := s.by(id).(Snapshotter); ok {
		return p.UpperDir(id)
	}
	return "", lacks(id, "give its writable layer")
}

func (s *Set) Fork(ctx context.Context, id string, opts ForkOptions) (*ForkImage, error) {
	if p, ok := s.by(id).(Forker); ok {
		return p.Fork(ctx, id, opts)
	}
	return nil, lacks(id, "fork")
}

// DropFork hands img back to the backend of its source.
func (s *Set) DropFork(img *ForkImage) {
	if img == nil {
		return
	}
	if p, ok := s.by(img.Source).(Forker); ok {
		p.DropFork(img)
	}
}

func (s *Set) Usage(id string) (Usage, error) {
	if u, ok := s.by(id).(UsageReader); ok {
		return u.Usage(id)
	}
	return Usage{}, errdefs.Unavailable("the runtime of %s reports no usage", id)
}

// MachineAvailable is nil when some backend can create machines here, else why not (the first
// Machine backend's reason).
func (s *Set) MachineAvailable() error {
	ms := Backends[Machine](s)
	if len(ms) == 0 {
		return errdefs.Unavailable("no backend on this node runs machines")
	}
	var first error
	for _, m := range ms {
		err := m.MachineAvailable()
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	return first
}

func (s *Set) machine(id string) (Machine, error) {
	if m, ok := s.by(id).(Machine); ok {
		return m, nil
	}
	return nil, errdefs.Conflict("sandbox %s is not a machine (tier vm)", id)
}

func (s *Set) Screen(ctx context.Context, id string) ([]byte, int, int, error) {
	m, err := s.machine(id)
	if err != nil {
		return nil, 0, 0, err
	}
	return m.Screen(ctx, id)
}

func (s *Set) Input(ctx context.Context, id string, events []InputEvent) (InputResult, error) {
	m, err := s.machine(id)
	if err != nil {
		return InputResult{}, err
	}
	return m.Input(ctx, id, events)
}

func (s *Set) Power(ctx context.Context, id, action string, force bool) error {
	m, err := s.machine(id)
	if err != nil {
		return err
	}
	return m.Power(ctx, id, action, force)
}

func (s *Set) Console(id string, limit int64) ([]byte, error) {
	m, err := s.machine(id)
	if err != nil {
		return nil, err
	}
	return m.Console(id, limit)
}

func (s *Set) VNC(ctx context.Context, id string) (net.Conn, error) {
	m, err := s.machine(id)
	if err != nil {
		return nil, err
	}
	return m.VNC(ctx, id)
}

func (s *Set) WaitAgent(ctx context.Context, id string, timeout time.Duration) error {
	m, err := s.machine(id)
	if err != nil {
		return err
	}
	return m.WaitAgent(ctx, id, timeout)
}

var (
	_ Runtime     = (*Set)(nil)
	_ Pauser      = (*Set)(nil)
	_ Snapshotter = (*Set)(nil)
	_ Forker      = (*Set)(nil)
	_ UsageReader = (*Set)(nil)
	_ Machine     = (*Set)(nil)
)

// Backend returns the backend that runs the named runtime, or nil.
func (s *Set) Backend(runtime string) Runtime { return s.byName[runtime] }
