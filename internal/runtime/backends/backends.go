// Package backends is where Corral's runtime backends are wired: the one list of them (All),
// the names of their option types for the daemon (RuncConfig, QEMUConfig, ...), and what they
// report about the host for /v1/info (Describe). It is the only package outside a backend's own
// that imports backend packages (internal/runtime's imports_test.go enforces it); everything
// else speaks internal/runtime.
//
// Adding a backend (Firecracker, Cloud Hypervisor) is its package under internal/runtime, which
// implements runtime.Runtime (and the optional interfaces it can) and exports a
// runtime.Factory, plus one line in All. Its options reach it as Open's opts[name].
package backends

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/corral-dev/corral/internal/runtime"
	"github.com/corral-dev/corral/internal/runtime/qemu"
	"github.com/corral-dev/corral/internal/runtime/runc"
)

// All are the backends, the default (runc: containers) first.
var All = []runtime.Backend{
	{Name: "runc", New: runc.Factory},
	{Name: "qemu", New: qemu.Factory},
}

// Open builds every backend of All as one runtime.Set, with opts[name] as each one's options.
func Open(ctx context.Context, node runtime.Node, opts map[string]any, log *slog.Logger) (*runtime.Set, error) {
	return runtime.Open(ctx, node, All, opts, log)
}

// The backends' option types (Open's opts values) and the constants the daemon's flags name.
type (
	// RuncConfig is the runc backend's options (opts["runc"]).
	RuncConfig = runc.Config
	// UserNS configures runc's user namespaces (RuncConfig.UserNS).
	UserNS = runc.UserNS
	// Budgets are each container sandbox's per-user kernel budgets (UserNS.Budgets).
	Budgets = runc.Budgets
	// QEMUConfig is the qemu backend's options (opts["qemu"]).
	QEMUConfig = qemu.Config
)

const (
	// DefaultRunc is the runc scripts/install-runc.sh builds.
	DefaultRunc = runc.DefaultRunc
	// DefaultRunsc is the runsc scripts/install-runsc.sh caches.
	DefaultRunsc = runc.DefaultRunsc

	DefaultInotifyInstances = runc.DefaultInotifyInstances
	DefaultInotifyWatches   = runc.DefaultInotifyWatches
	DefaultMsgQueueBytes    = runc.DefaultMsgQueueBytes
)

// Facts are what the backends say about this host, for /v1/info (the daemon copies them into
// the API's Info). Fields of backends a Set lacks stay empty.
type Facts struct {
	// RuntimeVersion is runc's version; Runtimes the container runtimes that work here (runc,
	// and gvisor when runsc does), GVisorVersion or GVisorUnavailable says which.
	RuntimeVersion                   string
	Runtimes                         []string
	GVisorVersion, GVisorUnavailable string
	// UserNS describes the container sandboxes' user namespaces, or UserNSUnavailable why none.
	UserNS, UserNSUnavailable string
	// QEMUVersion, and the microvm tier's accelerator or why it is off; VMUnavailable why the
	// vm tier is off.
	QEMUVersion                               string
	MicroVMAccelerator, MicroVMAcceleratorWhy string
	MicroVMUnavailable, VMUnavailable         string
}

// Describe reports what the backends of s say about this host.
func Describe(ctx context.Context, s *runtime.Set) (Facts, error) {
	var f Facts
	for _, rt := range runtime.Backends[*runc.Runtime](s) {
		v, err := rt.Version(ctx)
		if err != nil {
			return f, err
		}
		f.RuntimeVersion = v
		f.Runtimes = append(f.Runtimes, string(runc.EngineRunc))
		if v, err := rt.GVisor(); err != nil {
			f.GVisorUnavailable = err.Error()
		} else {
			f.GVisorVersion = v
			f.Runtimes = append(f.Runtimes, string(runc.EngineGVisor))
		}
		if why := rt.UserNSStatus(); why != "" {
			f.UserNSUnavailable = why
		} else {
			u := rt.UserNS()
			f.UserNS = fmt.Sprintf("uids %d-%d, %d ids each; budgets: %d inotify instances, %d watches, %d mqueue bytes",
				u.UIDBase, u.UIDBase+uint32(u.Slots)*runc.UserNSSize-1, runc.UserNSSize, u.Budgets.InotifyInstances, u.Budgets.InotifyWatches, u.Budgets.MsgQueueBytes)
		}
	}
	for _, vm := range runtime.Backends[*qemu.Runtime](s) {
		f.QEMUVersion = vm.Version()
		if err := vm.Available(qemu.RuntimeName); err != nil {
			f.MicroVMUnavailable = err.Error()
		} else {
			f.MicroVMAccelerator, f.MicroVMAcceleratorWhy = vm.Accelerator()
		}
		if err := vm.MachineAvailable(); err != nil {
			f.VMUnavailable = err.Error()
		}
	}
	return f, nil
}
