package model

import (
	"time"
)

// Node states. Only ready nodes take new sandboxes; draining ones also move theirs away
// (cluster mode); lost ones missed their lease and their sandboxes failed with node_lost.
const (
	NodeReady    = "ready"
	NodeCordoned = "cordoned"
	NodeDraining = "draining"
	NodeLost     = "lost"
)

// ReasonNodeLost is the reason of a sandbox whose node was lost.
const ReasonNodeLost = "node_lost"

// Resources is an amount of each resource a node offers or its sandboxes use.
type Resources struct {
	CPUs        float64 `json:"cpus"`
	MemoryBytes int64   `json:"memory_bytes"`
	DiskBytes   int64   `json:"disk_bytes"`
	Sandboxes   int     `json:"sandboxes"`
}

// Node is an edge: one host running sandboxes (cluster mode).
type Node struct {
	Name     string            `json:"name"`
	URL      string            `json:"url"`
	State    string            `json:"state"`
	Epoch    int64             `json:"epoch"` // this incarnation's fencing token
	Capacity Resources         `json:"capacity"`
	Used     Resources         `json:"used"`
	Labels   map[string]string `json:"labels,omitempty"`
	Tiers    []string          `json:"tiers,omitempty"`
	Runtimes []string          `json:"runtimes,omitempty"`
	// Protocol is the node protocol version the edge speaks (servers send it the caller, not
	// the user's token, from version 1 on); 0 for an edge older than the protocol.
	Protocol int `json:"protocol,omitempty"`
	// HeartbeatAt is the last heartbeat; LeaseExpiresAt when the node is lost without another.
	HeartbeatAt    time.Time `json:"heartbeat_at"`
	LeaseExpiresAt time.Time `json:"lease_expires_at"`
	RegisteredAt   time.Time `json:"registered_at"`
}
