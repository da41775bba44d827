package edge

import (
	"context"

	"github.com/corral-dev/corral/internal/catalog"
	"github.com/corral-dev/corral/internal/runtime"
)

// TierContainer and TierMicroVM are the tiers a create call may name (TierFncall's containers
// are made by fncall environments).
const (
	TierContainer = catalog.TierContainer
	TierMicroVM   = catalog.TierMicroVM
	// TierVM is a full machine from a disk image, with a screen, keyboard and mouse (machine.go).
	TierVM = catalog.TierVM
	// RuntimeQEMU runs microvm and vm sandboxes (the backend's name, runtime.Spec.Runtime).
	RuntimeQEMU = catalog.RuntimeQEMU
)

// layerImages returns the files of a microvm's layers (bottom first): each layer's EROFS
// image and its extra devices, which the VM gets as read-only disks.
func (e *Edge) layerImages(ctx context.Context, digests []string) ([]runtime.LayerImage, error) {
	out := make([]runtime.LayerImage, 0, len(digests))
	for _, d := range digests {
		img, devs, err := e.layers.Files(ctx, d)
		if err != nil {
			return nil, err
		}
		out = append(out, runtime.LayerImage{Image: img, Devices: devs})
	}
	return out, nil
}

// Tiers lists the tiers a create call may name on this node.
func (e *Edge) Tiers() []string {
	t := []string{TierContainer}
	if e.rt.Available(RuntimeQEMU) == nil {
		t = append(t, TierMicroVM)
	}
	if e.machines != nil && e.machines.MachineAvailable() == nil {
		t = append(t, TierVM)
	}
	return t
}
