// Package runtime is the seam between the edge and the backends that run sandboxes: the Runtime
// contract, the runtime-neutral Spec a sandbox is created from, the types a backend returns
// (Sandbox, Status, PauseStats, ...), the optional interfaces for what only some backends do
// (Pauser, Snapshotter, Forker, UsageReader, Machine), a registry of backends by name, and Set,
// which routes each call to the backend that runs the sandbox.
//
// # Backends
//
// A backend lives in a package of its own under internal/runtime (runc: runc and gVisor
// containers; qemu: microvm and vm machines) and imports no other backend. It registers a
// Factory under its name in the one wiring list (internal/runtime/backends); nothing outside
// internal/runtime/* imports a backend package, which a test enforces (imports_test.go). Adding
// a backend (Firecracker, Cloud Hypervisor) is its package plus one line in that list.
//
// # Lifecycle
//
// Create is all-or-nothing: on error nothing of the sandbox is left on the host. Open
// re-adopts a sandbox an earlier process created (Corral restarts without ending its
// sandboxes). Status is cheap enough to call for every sandbox every few seconds. Delete is
// idempotent and leaves nothing behind; List names every sandbox the backend finds on the host,
// including leftovers of a crash, so the edge can delete what its store does not know.
//
// Errors are internal/errdefs kinds: ErrNotFound for an unknown sandbox, ErrConflict for a call
// the sandbox's state refuses (pausing a paused one), ErrInvalid for a Spec the backend cannot
// run, ErrUnavailable for what this host cannot do now and, from Set, for an optional
// operation the sandbox's backend lacks (also ErrUnavailable: "this sandbox cannot").
//
// Specs arrive resolved: limits are filled in and bounded once, in admission (internal/limits).
// A backend checks its own invariants (what it can run) and refuses a Spec it cannot run; it
// never chooses values.
package runtime
