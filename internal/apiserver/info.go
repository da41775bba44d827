package apiserver

import (
	"github.com/corral-dev/corral/internal/model"
)

// Info is what the daemon knows of its node and serves by GET /v1/info (New). It is the API's
// corral.Info field for field and tag for tag, so that the daemon fills it without the SDK
// (issue 29 item 5) and getInfo converts it with a plain conversion where it writes it, which
// stops compiling the day a field or tag changes on one side only; TestInfoConversion holds the
// JSON byte for byte. Sandboxes and Disk are filled in per call.
type Info struct {
	Version     string `json:"version"`
	Node        string `json:"node"`
	Runtime     string `json:"runtime"`      // the default runtime, "runc"
	RuntimePath string `json:"runtime_path"` // the binary in use
	// RuntimeVersion is the first line of `runc --version`.
	RuntimeVersion string `json:"runtime_version"`
	// Runtimes lists the runtimes sandboxes can be created with here ("runc", "gvisor").
	Runtimes []string `json:"runtimes"`
	// GVisorVersion is the first line of `runsc --version`; GVisorUnavailable says why gVisor
	// cannot be used here when it cannot.
	GVisorVersion     string `json:"gvisor_version,omitempty"`
	GVisorUnavailable string `json:"gvisor_unavailable,omitempty"`
	// LXCFSVersion is the version of the LXCFS that gives container sandboxes their own /proc
	// files; LXCFSUnavailable says why none runs here (they then read the host's).
	LXCFSVersion     string `json:"lxcfs_version,omitempty"`
	LXCFSUnavailable string `json:"lxcfs_unavailable,omitempty"`
	// UserNS describes the user namespaces container sandboxes (runc) run in;
	// UserNSUnavailable says why they run without.
	UserNS            string `json:"userns,omitempty"`
	UserNSUnavailable string `json:"userns_unavailable,omitempty"`
	// Tiers lists the tiers sandboxes can be created in here ("container", "microvm", "vm").
	Tiers []string `json:"tiers,omitempty"`
	// MicroVMAccelerator is what microvm sandboxes run on here ("kvm" or "tcg") and
	// MicroVMAcceleratorWhy why; MicroVMUnavailable says why microvm sandboxes cannot be
	// created here when they cannot. QEMUVersion is QEMU's version line.
	MicroVMAccelerator    string `json:"microvm_accelerator,omitempty"`
	MicroVMAcceleratorWhy string `json:"microvm_accelerator_why,omitempty"`
	MicroVMUnavailable    string `json:"microvm_unavailable,omitempty"`
	QEMUVersion           string `json:"qemu_version,omitempty"`
	// VMUnavailable says why vm sandboxes cannot be created here when they cannot.
	VMUnavailable string `json:"vm_unavailable,omitempty"`
	// NetworkPool is the sandbox address pool when sandbox networking is on; NetworkOff says
	// why it is off.
	NetworkPool   string `json:"network_pool,omitempty"`
	NetworkOff    string `json:"network_off,omitempty"`
	DataDir       string `json:"data_dir"`
	Sandboxes     int    `json:"sandboxes"` // filled in per call (operators)
	CgroupVersion string `json:"cgroup_version"`
	// Disk is the node's disk account, filled in per call (operators only).
	Disk *model.DiskAccount `json:"disk,omitempty"`
}
