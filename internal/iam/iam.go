// Package iam is Corral's authorisation model: permissions and the roles that bundle them,
// project paths and the tree relations between them, token secrets, and the decision of what a
// request may do. It holds no state; the store keeps principals, projects, grants and tokens, and
// the API server asks this package what they allow.
//
// The model, in one paragraph: a principal (a person, a service or an agent) holds roles on
// projects through grants, and a role granted on a project holds in its whole subtree. A token
// belongs to one principal and carries a scope: a project (it acts only in that project's
// subtree) and a permission set. A request may do X on project P when P lies in the token's
// scope, the token's set contains X, and the principal still holds X on P through a grant on P or
// an ancestor. Tokens are minted only within the minter's scope and permissions, so nothing can
// be handed down that was not held.
package iam

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math/bits"
	"slices"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazyregexp"
)

// Perm is a set of permissions, one bit each.
type Perm uint32

// The permissions, in the order of permNames.
const (
	SandboxRead Perm = 1 << iota
	SandboxCreate
	SandboxUse
	SandboxAdmin
	LayerRead
	LayerPublish
	ProjectRead
	ProjectCreate
	ProjectGrant
	QuotaDelegate
	AuditRead
	Operator

	// All is every permission.
	All = Operator<<1 - 1
)

// permNames are the permissions' names on the wire, the SDK's Perm* constants (a test in
// internal/apiserver holds them equal: the API speaks these names, iam does not import the SDK).
var permNames = []string{
	"sandbox.read", "sandbox.create", "sandbox.use", "sandbox.admin",
	"layer.read", "layer.publish", "project.read", "project.create",
	"project.grant", "quota.delegate", "audit.read", "operator",
}

// The role names, the SDK's Role* constants.
const (
	RoleViewer = "viewer" // read-only
	RoleUser   = "user"   // viewer + create and use sandboxes
	RoleAdmin  = "admin"  // user + manage sandboxes, publish layers, subprojects, quotas, audit
	RoleOwner  = "owner"  // admin + grant roles and mint tokens for other principals, operator
)

// The principal kinds, the SDK's Kind{User,Service,Agent}.
const (
	KindUser    = "user"
	KindService = "service"
	KindAgent   = "agent"
)

// RootProject is how the API and people write the root project's path (canonically ""), the
// SDK's RootProject.
const RootProject = "/"

// The roles, each a superset of the one before.
var (
	viewer = SandboxRead | LayerRead | ProjectRead
	user   = viewer | SandboxCreate | SandboxUse
	admin  = user | SandboxAdmin | LayerPublish | ProjectCreate | QuotaDelegate | AuditRead
	owner  = admin | ProjectGrant | Operator
)

// Roles lists the role names, weakest first.
var Roles = []string{RoleViewer, RoleUser, RoleAdmin, RoleOwner}

// RolePerms returns the permissions of a role.
func RolePerms(role string) (Perm, bool) {
	switch role {
	case RoleViewer:
		return viewer, true
	case RoleUser:
		return user, true
	case RoleAdmin:
		return admin, true
	case RoleOwner:
		return owner, true
	}
	return 0, false
}

// RoleOf names the role whose permissions are exactly p, or "" when none is.
func RoleOf(p Perm) string {
	for _, r := range Roles {
		if rp, _ := RolePerms(r); rp == p {
			return r
		}
	}
	return ""
}

// ParsePerms turns permission names into a set.
func ParsePerms(names []string) (Perm, error) {
	var p Perm
	for _, n := range names {
		i := slices.Index(permNames, n)
		if i < 0 {
			return 0, errdefs.Invalid("permissions", "%q is not a permission (known: %s)", n, strings.Join(permNames, ", "))
		}
		p |= 1 << i
	}
	return p, nil
}

// Names lists the permissions in p.
func (p Perm) Names() []string {
	out := make([]string, 0, bits.OnesCount32(uint32(p)))
	for i, n := range permNames {
		if p&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return out
}

// Has reports whether p contains every permission of q.
func (p Perm) Has(q Perm) bool { return p&q == q }

// String is the first permission's name (what a refusal names), or a list.
func (p Perm) String() string { return strings.Join(p.Names(), ",") }

// MaxDepth bounds how deep projects nest.
const MaxDepth = 32

var segmentRE = lazyregexp.New(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ParsePath checks a project path and returns it in canonical form: names joined by '/', without
// leading or trailing slashes; the root is "". "/" and "" both name the root.
func ParsePath(field, s string) (string, error) {
	if len(s) > 1024 {
		return "", errdefs.Invalid(field, "project path is longer than 1024 bytes")
	}
	p := strings.TrimSuffix(strings.TrimPrefix(s, "/"), "/")
	if p == "" {
		return "", nil
	}
	parts := strings.Split(p, "/")
	if len(parts) > MaxDepth {
		return "", errdefs.Invalid(field, "project %q is nested %d deep; at most %d", s, len(parts), MaxDepth)
	}
	for _, part := range parts {
		if !segmentRE.MatchString(part) || part == "." || part == ".." {
			return "", errdefs.Invalid(field, "project path %q: %q is not a project name (lower-case letters, digits, '.', '_', '-'; at most 63; not starting with a punctuation mark)", s, part)
		}
	}
	return p, nil
}

// Display renders a canonical path for people and the API: the root is "/".
func Display(p string) string {
	if p == "" {
		return RootProject
	}
	return p
}

// Parent returns the parent of a canonical path; the root has none (ok false).
func Parent(p string) (string, bool) {
	if p == "" {
		return "", false
	}
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return "", true
	}
	return p[:i], true
}

// Ancestors returns the canonical paths from the root down to p, p included.
func Ancestors(p string) []string {
	out := []string{""}
	if p == "" {
		return out
	}
	for i := 0; i < len(p); i++ {
		if p[i] == '/' {
			out = append(out, p[:i])
		}
	}
	return append(out, p)
}

// Within reports whether p is scope or lies below it.
func Within(p, scope string) bool {
	return scope == "" || p == scope || strings.HasPrefix(p, scope+"/")
}

// SubtreeRange returns the bounds of the strict descendants of p in byte order: every
// descendant's path d satisfies lo < d < hi, and nothing else does (for p = "a/b": "a/b/" and
// "a/b0", since '0' follows '/'). For the root every non-empty path is a descendant.
func SubtreeRange(p string) (lo, hi string) {
	if p == "" {
		return "", "\xff"
	}
	return p + "/", p + "0"
}

// LayerVisible reports whether a layer owned by project owner may be seen and used from project
// at. A public layer is visible everywhere; otherwise its own project sees it, and so do the
// owner's descendants unless the layer is private, except that the root project's layers reach
// no other project unless public: the root is the operator's, and what it keeps (a snapshot
// with an answer key) is not every tenant's.
func LayerVisible(owner string, private, public bool, at string) bool {
	switch {
	case owner == at || public:
		return true
	case private || owner == "":
		return false
	}
	return Within(at, owner)
}

// TokenPrefix starts every token Corral issues, so a leaked one is recognisable.
const TokenPrefix = "crl_"

// NewToken returns a fresh secret and the ID under which its record is listed. The secret has 256
// random bits; the ID is independent of it.
func NewToken() (secret, id string) {
	var b [tokenBytes]byte
	rand.Read(b[:])
	var i [8]byte
	rand.Read(i[:])
	return TokenPrefix + base64.RawURLEncoding.EncodeToString(b[:]), "tok-" + hex.EncodeToString(i[:])
}

// E2BKeyPrefix starts a token's E2B alias. E2B's SDKs (the Python one since 2.25) refuse an API
// key that is not "e2b_" followed by lowercase hex, so every token can also be written that way:
// the same 256 secret bits in hex instead of base64. The alias is the token (one hash, one record,
// revoked together); nothing about it is stored.
const E2BKeyPrefix = "e2b_"

// tokenBytes is the size of a token's secret.
const tokenBytes = 32

// E2BKey returns the E2B alias of a token secret ("crl_" and 43 base64url characters): "e2b_"
// and the secret's 32 bytes in lowercase hex. An alias is returned as it is.
func E2BKey(secret string) (string, error) {
	if _, ok := e2bBytes(secret); ok {
		return secret, nil
	}
	rest, ok := strings.CutPrefix(secret, TokenPrefix)
	b, err := base64.RawURLEncoding.Strict().DecodeString(rest)
	if !ok || err != nil || len(b) != tokenBytes {
		return "", fmt.Errorf("not a Corral token (%s followed by 43 base64url characters): %w", TokenPrefix, errdefs.ErrInvalid)
	}
	return E2BKeyPrefix + hex.EncodeToString(b), nil
}

// CanonicalToken returns the token secret an E2B alias stands for, and any other string as it is.
func CanonicalToken(tok string) string {
	if b, ok := e2bBytes(tok); ok {
		return TokenPrefix + base64.RawURLEncoding.EncodeToString(b)
	}
	return tok
}

// e2bBytes decodes an E2B alias: "e2b_" and exactly 64 lowercase hex digits.
func e2bBytes(s string) ([]byte, bool) {
	h, ok := strings.CutPrefix(s, E2BKeyPrefix)
	if !ok || len(h) != 2*tokenBytes {
		return nil, false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return nil, false
		}
	}
	b, err := hex.DecodeString(h)
	return b, err == nil
}

// NewID returns a random ID with a prefix ("prj-").
func NewID(prefix string) string {
	var b [8]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// maxTokenLen bounds a bearer token: anything longer is refused before it is hashed.
const maxTokenLen = 512

// ParseBearer extracts the token of an Authorization header ("Bearer TOKEN"). The scheme is
// case-insensitive (RFC 9110); the token must be printable ASCII without spaces. An E2B alias
// (E2BKey) comes back as the token it stands for.
func ParseBearer(header string) (string, error) {
	scheme, tok, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", fmt.Errorf("missing bearer token (set CORRAL_TOKEN): %w", errdefs.ErrUnauthorized)
	}
	tok = strings.TrimLeft(tok, " ")
	if tok == "" || len(tok) > maxTokenLen {
		return "", fmt.Errorf("malformed bearer token: %w", errdefs.ErrUnauthorized)
	}
	for i := 0; i < len(tok); i++ {
		if c := tok[i]; c <= ' ' || c >= 0x7f {
			return "", fmt.Errorf("malformed bearer token: %w", errdefs.ErrUnauthorized)
		}
	}
	return CanonicalToken(tok), nil
}

var principalRE = lazyregexp.New(`^[a-z0-9][a-z0-9._@-]{0,63}$`)

// CheckPrincipalName validates a principal's name.
func CheckPrincipalName(field, name string) error {
	if !principalRE.MatchString(name) {
		return errdefs.Invalid(field, "%q is not a principal name (lower-case letters, digits, '.', '_', '@', '-'; at most 64)", name)
	}
	return nil
}

// CheckKind validates a principal kind.
func CheckKind(kind string) error {
	switch kind {
	case KindUser, KindService, KindAgent:
		return nil
	}
	return errdefs.Invalid("kind", "%q is not a principal kind (user, service or agent)", kind)
}

// DeniedError is a 403 naming the permission that was missing and where.
type DeniedError struct {
	Perm    Perm
	Project string // canonical path
	Why     string // what else was wrong, if anything ("outside the token's scope /a")
	// Hidden leaves the project out of the message: the caller may not learn where an object
	// outside its scope lives.
	Hidden bool
}

func (e *DeniedError) Error() string {
	if e.Hidden {
		return fmt.Sprintf("permission %s is required (%s)", e.Perm, e.Why)
	}
	msg := fmt.Sprintf("permission %s is required on project %s", e.Perm, Display(e.Project))
	if e.Why != "" {
		msg += " (" + e.Why + ")"
	}
	return msg
}

// Unwrap makes a DeniedError an errdefs.ErrDenied.
func (e *DeniedError) Unwrap() error { return errdefs.ErrDenied }

// Permission names the missing permission for the API's error body.
func (e *DeniedError) Permission() string { return e.Perm.String() }

// QuotaExceeded is the detail of a refusal by a quota: the fields (and JSON) of the SDK's
// QuotaExceeded, which internal/httpjson converts it to for the API's error body (a test in
// internal/apiserver holds the two equal).
type QuotaExceeded struct {
	Project  string  `json:"project"`  // the full project (the requester's or an ancestor)
	Resource string  `json:"resource"` // sandboxes, cpus, memory_bytes, disk_bytes, creates_per_minute, artifact_bytes, tiers.NAME
	Limit    float64 `json:"limit"`
	Usage    float64 `json:"usage"`
	Request  float64 `json:"request"`
}

// String describes the refusal in one line, as the SDK's QuotaExceeded does.
func (q *QuotaExceeded) String() string {
	n := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	return fmt.Sprintf("project %s: %s limit %s, in use %s, requested %s", q.Project, q.Resource, n(q.Limit), n(q.Usage), n(q.Request))
}

// QuotaError is a 429: a limit of a project would be exceeded.
type QuotaError struct{ QuotaExceeded }

func (e *QuotaError) Error() string { return "quota exceeded: " + e.QuotaExceeded.String() }

// Unwrap makes a QuotaError an errdefs.ErrExhausted.
func (e *QuotaError) Unwrap() error { return errdefs.ErrExhausted }
