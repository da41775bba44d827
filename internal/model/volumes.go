package model

import (
	"time"
)

// Volume is a persistent filesystem that outlives the sandboxes it is mounted into (datasets,
// caches, a user's home). It belongs to a project, whose disk quota it is charged to.
type Volume struct {
	Name    string `json:"name"`
	Project string `json:"project"`
	// SizeBytes is the filesystem's size, allocated in full when the volume is made.
	SizeBytes int64 `json:"size_bytes"`
	// Node is where the volume's data lives (in a cluster: the node that made the record; the
	// data is in the cluster's blob store and attaches on any node).
	Node      string    `json:"node"`
	CreatedAt time.Time `json:"created_at"`
	// AttachedTo lists the sandboxes the volume is mounted into now (paused ones included).
	AttachedTo []VolumeAttachment `json:"attached_to,omitempty"`
}

// VolumeAttachment is a sandbox a volume is mounted into.
type VolumeAttachment struct {
	Sandbox  string `json:"sandbox"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// CreateVolumeRequest is the body of POST /v1/volumes.
type CreateVolumeRequest struct {
	// Name is 1-63 lowercase letters, digits, '.', '_' or '-', starting and ending with a letter
	// or digit; unique in its project.
	Name string `json:"name"`
	// SizeBytes is the size of the volume's filesystem (at least 16 MiB).
	SizeBytes int64 `json:"size_bytes"`
	// Project owns the volume; empty: the project of the caller's token.
	Project string `json:"project,omitempty"`
}

// VolumeMount mounts a volume into a sandbox (CreateRequest.Volumes).
type VolumeMount struct {
	// Name is a volume of the sandbox's project.
	Name string `json:"name"`
	// Path is an absolute path inside the sandbox, not / and not under /proc, /dev, /sys or
	// Corral's own paths.
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}
