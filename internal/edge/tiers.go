package edge

import (
	"context"
	"errors"
	"net"
	"slices"
	"time"

	"github.com/corral-dev/corral/internal/runtime/runc"
	corral "github.com/corral-dev/corral/sdk/go"
)

// TierContainer and TierMicroVM are the tiers a create call may name (TierFncall's containers
// are made by fncall environments).
const (
	TierContainer = "container"
	TierMicroVM   = "microvm"
	// TierVM is a full machine from a disk image, with a screen, keyboard and mouse (machine.go).
	TierVM = "vm"
	// RuntimeQEMU runs microvm sandboxes.
	RuntimeQEMU = string(runc.EngineQEMU)
)

// VMRuntime runs microvm sandboxes (internal/runtime/qemu implements it): the Runtime calls,
// plus whether it can create VMs here and on which accelerator.
type VMRuntime interface {
	Runtime
	// Has reports whether id is one of its sandboxes.
	Has(id string) bool
	// Available is nil when VMs can be created here, else why not.
	Available() error
	// Accelerator names what new VMs run on ("kvm" or "tcg") and why.
	Accelerator() (accel, why string)
	// Version is QEMU's version line.
	Version() string
	// MachineAvailable is nil when vm sandboxes can be created here, else why not.
	MachineAvailable() error
	// Screen returns a PNG of a vm's display and its size.
	Screen(ctx context.Context, id string) (png []byte, width, height int, err error)
	// Input sends keyboard and mouse events to a vm.
	Input(ctx context.Context, id string, events []corral.InputEvent) (corral.InputResult, error)
	// Power turns a vm off (force: at once) or on, or resets it (corral.PowerOn, ...).
	Power(ctx context.Context, id, action string, force bool) error
	// Console returns the end of a VM's serial console output, at most limit bytes.
	Console(id string, limit int64) ([]byte, error)
	// VNC connects a new RFB client to a vm's display.
	VNC(ctx context.Context, id string) (net.Conn, error)
	// WaitAgent waits up to timeout for a VM's agent to answer.
	WaitAgent(ctx context.Context, id string, timeout time.Duration) error
}

// tiered is the edge's Runtime when it also runs VMs: creates go by engine, every other call
// to whichever runtime has the sandbox.
type tiered struct {
	ct Runtime
	vm VMRuntime
}

func (t *tiered) by(id string) Runtime {
	if t.vm.Has(id) {
		return t.vm
	}
	return t.ct
}

func (t *tiered) Create(ctx context.Context, spec runc.Spec) (*runc.Sandbox, error) {
	if spec.Engine == runc.EngineQEMU {
		return t.vm.Create(ctx, spec)
	}
	return t.ct.Create(ctx, spec)
}

func (t *tiered) Open(ctx context.Context, id string) (*runc.Sandbox, error) {
	return t.by(id).Open(ctx, id)
}

func (t *tiered) Status(ctx context.Context, id string) (runc.Status, error) {
	return t.by(id).Status(ctx, id)
}

func (t *tiered) Delete(ctx context.Context, id string) error { return t.by(id).Delete(ctx, id) }
func (t *tiered) Kill(ctx context.Context, id string) error   { return t.by(id).Kill(ctx, id) }

func (t *tiered) List(ctx context.Context) ([]string, error) {
	a, err1 := t.ct.List(ctx)
	b, err2 := t.vm.List(ctx)
	ids := append(a, b...)
	slices.Sort(ids)
	return slices.Compact(ids), errors.Join(err1, err2)
}

func (t *tiered) Pause(ctx context.Context, id string) (runc.PauseStats, error) {
	return t.by(id).Pause(ctx, id)
}

func (t *tiered) Resume(ctx context.Context, id string) (runc.ResumeStats, error) {
	return t.by(id).Resume(ctx, id)
}

func (t *tiered) Freeze(ctx context.Context, id string) error { return t.by(id).Freeze(ctx, id) }
func (t *tiered) Thaw(ctx context.Context, id string) error   { return t.by(id).Thaw(ctx, id) }
func (t *tiered) UpperDir(id string) (string, error)          { return t.by(id).UpperDir(id) }
func (t *tiered) GVisor() (string, error)                     { return t.ct.GVisor() }

func (t *tiered) Fork(ctx context.Context, id string, opts runc.ForkOptions) (*runc.ForkImage, error) {
	return t.by(id).Fork(ctx, id, opts)
}

func (t *tiered) DropFork(img *runc.ForkImage) {
	if img != nil {
		t.by(img.Source).DropFork(img)
	}
}

// layerImages returns the files of a microvm's layers (bottom first): each layer's EROFS
// image and its extra devices, which the VM gets as read-only disks.
func (e *Edge) layerImages(ctx context.Context, digests []string) ([]runc.LayerImage, error) {
	out := make([]runc.LayerImage, 0, len(digests))
	for _, d := range digests {
		img, devs, err := e.layers.Files(ctx, d)
		if err != nil {
			return nil, err
		}
		out = append(out, runc.LayerImage{Image: img, Devices: devs})
	}
	return out, nil
}

// Tiers lists the tiers a create call may name on this node.
func (e *Edge) Tiers() []string {
	t := []string{TierContainer}
	if e.cfg.VM != nil && e.cfg.VM.Available() == nil {
		t = append(t, TierMicroVM)
	}
	if e.cfg.VM != nil && e.cfg.VM.MachineAvailable() == nil {
		t = append(t, TierVM)
	}
	return t
}
