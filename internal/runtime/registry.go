package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
)

// Node is what every backend is built from: the facts of this node that are not any one
// backend's.
type Node struct {
	// DataDir is Corral's data directory; a backend keeps its state in directories of its own
	// under it (runc: sandboxes/, runc/, runsc/; qemu: vms/, vmboot/).
	DataDir string
	// CgroupParent is the cgroup every sandbox's cgroups are made under (internal/runtime/cgroups).
	CgroupParent string
	// DefaultDiskBytes is the node's default sandbox disk (runc makes disks of it ahead).
	DefaultDiskBytes int64
	// SparseDisks makes writable disks sparse instead of allocating them when made.
	SparseDisks bool
}

// Factory builds a backend. opts are the backend's own options (a pointer to the Config type
// its package defines; nil: its defaults), opaque to everyone but the backend.
type Factory func(ctx context.Context, node Node, opts any, log *slog.Logger) (Runtime, error)

// Backend is a backend as the registry knows it: its name and how to build it.
type Backend struct {
	// Name keys the backend's options (Open's opts) and its log lines.
	Name string
	New  Factory
}

// Open builds backends in order (the first is the default of the Set) with opts[name] as each
// one's options. On error it closes the ones it built.
func Open(ctx context.Context, node Node, backends []Backend, opts map[string]any, log *slog.Logger) (*Set, error) {
	var built []Runtime
	fail := func(err error) (*Set, error) {
		for _, b := range built {
			err = errors.Join(err, b.Close())
		}
		return nil, err
	}
	for _, b := range backends {
		rt, err := b.New(ctx, node, opts[b.Name], log.With("runtime", b.Name))
		if err != nil {
			return fail(fmt.Errorf("runtime %s: %w", b.Name, err))
		}
		built = append(built, rt)
	}
	s, err := NewSet(built...)
	if err != nil {
		return fail(err)
	}
	return s, nil
}

// OptionsOf returns a backend's options as its Factory got them: opts when it is a *T, a new T
// (the defaults) when nil, and an error for anything else.
func OptionsOf[T any](opts any) (*T, error) {
	switch o := opts.(type) {
	case nil:
		return new(T), nil
	case *T:
		c := *o
		return &c, nil
	}
	return nil, fmt.Errorf("options are %T, want %T", opts, new(T))
}
