package model

import (
	"time"
)

// Permissions. A permission granted on a project holds in the project and all its descendants.
const (
	PermSandboxRead   = "sandbox.read"   // list and get sandboxes
	PermSandboxCreate = "sandbox.create" // create sandboxes (and fncall environments)
	PermSandboxUse    = "sandbox.use"    // exec, commands, files, calls
	PermSandboxAdmin  = "sandbox.admin"  // delete, pause, resume, TTL, network, snapshot
	PermLayerRead     = "layer.read"     // list and get layers and environments
	PermLayerPublish  = "layer.publish"  // import, tag, delete layers; save environments
	PermProjectRead   = "project.read"   // see projects, quotas, grants, principals
	PermProjectCreate = "project.create" // create, move and delete subprojects
	PermProjectGrant  = "project.grant"  // grant roles, create principals, mint tokens for others
	PermQuotaDelegate = "quota.delegate" // set the quota of a child project
	PermAuditRead     = "audit.read"     // read the audit log
	PermOperator      = "operator"       // installation-wide settings (service catalog, layer gc, metrics); only held on the root project
)

// Roles bundle permissions; each includes the one before it.
const (
	RoleViewer = "viewer" // read-only
	RoleUser   = "user"   // viewer + create and use sandboxes
	RoleAdmin  = "admin"  // user + manage sandboxes, publish layers, subprojects, quotas, audit
	RoleOwner  = "owner"  // admin + grant roles and mint tokens for other principals, operator
)

// Principal kinds.
const (
	KindUser    = "user"
	KindService = "service"
	KindAgent   = "agent"
)

// RootProject is the path of the project every other project descends from.
const RootProject = "/"

// Project is a node of the project tree. Paths are slash-separated names ("team-a/rollout-17");
// the root is "/".
type Project struct {
	ID        string    `json:"id"`
	Path      string    `json:"path"`
	Parent    string    `json:"parent,omitempty"` // the parent's path; empty for the root
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by"`
	// Sandboxes counts the live (creating, running, paused, off) sandboxes in the project itself.
	Sandboxes int `json:"sandboxes"`
}

// ProjectRequest is the body of POST /v1/projects.
type ProjectRequest struct {
	Path string `json:"path"`
}

// MoveProjectRequest is the body of POST /v1/projects/move: the subtree at From becomes To.
type MoveProjectRequest struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Force bool   `json:"force,omitempty"` // move even with live sandboxes in the subtree
}

// Quota is a project's limits. A nil field is no limit of its own (the ancestors' still hold).
type Quota struct {
	Sandboxes        *int64           `json:"sandboxes,omitempty"`          // live sandboxes in the subtree
	CPUs             *float64         `json:"cpus,omitempty"`               // sum of the live sandboxes' CPU limits
	MemoryBytes      *int64           `json:"memory_bytes,omitempty"`       // sum of memory limits
	DiskBytes        *int64           `json:"disk_bytes,omitempty"`         // sum of writable-disk limits
	CreatesPerMinute *int64           `json:"creates_per_minute,omitempty"` // creations in the last 60 s
	Tiers            map[string]int64 `json:"tiers,omitempty"`              // live sandboxes per tier
	// ArtifactBytes bounds the fncall artifacts (CallRequest.Keep) the subtree's calls keep on
	// each node. Unset on a project, its own calls keep at most DefaultArtifactBytes (its
	// ancestors' limits still hold).
	ArtifactBytes *int64 `json:"artifact_bytes,omitempty"`
}

// DefaultArtifactBytes is a project's artifact quota (Quota.ArtifactBytes) when it sets none.
const DefaultArtifactBytes = 1 << 30

// Usage is what a project's subtree uses now, in the units of [Quota].
type Usage struct {
	Sandboxes        int64            `json:"sandboxes"`
	CPUs             float64          `json:"cpus"`
	MemoryBytes      int64            `json:"memory_bytes"`
	DiskBytes        int64            `json:"disk_bytes"`
	CreatesPerMinute int64            `json:"creates_per_minute"`
	Tiers            map[string]int64 `json:"tiers,omitempty"`
}

// ProjectQuota is the answer of GET and PUT /v1/quotas/{path}: the project's limits, its
// subtree's usage, and how much of each limit its children hold as their own limits.
type ProjectQuota struct {
	Project   string `json:"project"`
	Limit     Quota  `json:"limit"`
	Usage     Usage  `json:"usage"`
	Delegated Quota  `json:"delegated"`
}

// QuotaExceeded is the detail of a 429 refusal by a quota ([Error.Quota]).
type QuotaExceeded struct {
	Project  string  `json:"project"`  // the full project (the requester's or an ancestor)
	Resource string  `json:"resource"` // sandboxes, cpus, memory_bytes, disk_bytes, creates_per_minute, artifact_bytes, tiers.NAME
	Limit    float64 `json:"limit"`
	Usage    float64 `json:"usage"`
	Request  float64 `json:"request"`
}

// Principal is an identity: a person, a service or an agent.
type Principal struct {
	Name      string    `json:"name"`
	Kind      string    `json:"kind"`
	Project   string    `json:"project"` // the project it was created in
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by,omitempty"`
}

// Grant gives a principal a role on a project (and so on all its descendants).
type Grant struct {
	Project   string    `json:"project"`
	Principal string    `json:"principal"`
	Role      string    `json:"role"`
	CreatedAt time.Time `json:"created_at,omitzero"`
	CreatedBy string    `json:"created_by,omitempty"`
}

// TokenRequest is the body of POST /v1/tokens.
type TokenRequest struct {
	// Project is the token's scope: it acts in this project's subtree only.
	Project string `json:"project"`
	// Role gives the token the role's permissions; Permissions lists them one by one instead (give
	// one or the other, not both). Either way they must be among those the issuing token may use
	// on that project.
	Role        string   `json:"role,omitempty"`
	Permissions []string `json:"permissions,omitempty"`
	// TTL is how long the token lives (Go duration); empty: until revoked.
	TTL string `json:"ttl,omitempty"`
	// Principal names an existing principal to mint for (the caller's own by default when Kind
	// and Name are empty too). Minting for another principal needs project.grant.
	Principal string `json:"principal,omitempty"`
	// Kind and Name create a new principal (kind agent unless said) in Project, granted Role there,
	// and mint its first token. Name defaults to a generated one.
	Kind string `json:"kind,omitempty"`
	Name string `json:"name,omitempty"`
}

// Token is an API token's record. The secret itself is shown once, in the answer to POST
// /v1/tokens; the server keeps only its hash.
type Token struct {
	ID          string     `json:"id"`
	Token       string     `json:"token,omitempty"`
	Principal   string     `json:"principal"`
	Project     string     `json:"project"`
	Role        string     `json:"role,omitempty"`
	Permissions []string   `json:"permissions"`
	Parent      string     `json:"parent,omitempty"` // the token that minted it
	CreatedAt   time.Time  `json:"created_at"`
	ExpiresAt   *time.Time `json:"expires_at,omitempty"`
	RevokedAt   *time.Time `json:"revoked_at,omitempty"`
}

// Whoami is the answer of GET /v1/whoami: the caller's principal and token, and what the token
// may do on its project: the token's permissions that the principal's grants back there
// (Token.Permissions lists what the token carries, held or not).
type Whoami struct {
	Principal   Principal `json:"principal"`
	Token       Token     `json:"token"`
	Permissions []string  `json:"permissions"`
}

// AuditEntry is one management action in the audit log.
type AuditEntry struct {
	ID        int64     `json:"id"`
	At        time.Time `json:"at"`
	Principal string    `json:"principal"`
	Token     string    `json:"token,omitempty"`
	Project   string    `json:"project"`
	Action    string    `json:"action"` // sandbox.create, project.delete, token.mint, ...
	Target    string    `json:"target,omitempty"`
	Result    string    `json:"result"` // "ok", or the error code ("denied", "exhausted", ...)
	Detail    string    `json:"detail,omitempty"`
}

// AuditQuery selects audit entries: those of Project's subtree, newest first.
type AuditQuery struct {
	Project string
	Action  string // exact action, or a prefix ending in "." ("sandbox.")
	Before  int64  // entries with an ID below this one (paging); 0: the newest
	Limit   int    // at most this many; 0: the server's default (100)
}

// ProjectPlacement keeps a project's sandboxes on some node groups of a cluster and off others,
// which bounds the blast radius of one tenant. A node group is a label selector: the labels a
// node must all carry (group=gpu-a). Only operators set it.
type ProjectPlacement struct {
	// Project is the project's path (in answers).
	Project string `json:"project,omitempty"`
	// Pin, when not empty, keeps the sandboxes on nodes that match at least one selector.
	Pin []map[string]string `json:"pin"`
	// Avoid keeps them off nodes that match any selector.
	Avoid []map[string]string `json:"avoid"`
	// Effective (in answers) is what applies to the project's sandboxes: the Pin of the nearest
	// project on the way up to the root that sets one, and the Avoid of all of them.
	Effective *ProjectPlacement `json:"effective,omitempty"`
}
