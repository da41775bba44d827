// Package nodeproto is the protocol a cluster's servers speak to its edges over mutual TLS: which
// version a request speaks, who the end user is (authenticated once, by the server), and why an
// edge refused a request, as a typed refusal the server acts on instead of reading error text.
//
// A server authenticates every request it forwards. It then sends the edge the caller it found
// (token, principal, scope and the permissions the principal's grants give, never the token's
// secret) in HeaderCaller, with HeaderVersion, and the user's token stays on the server. An edge
// that serves a cluster (its API behind clusterauth.RequireServer) takes the caller from the
// header and never looks a token up; anything else ignores the header.
//
// An edge answers a refusal with HeaderRefusal beside its usual JSON error. The server tries
// another node for NodeFull (no room, draining, labels that do not match), StaleEpoch (the edge
// is an incarnation the cluster has fenced off) and WrongVersion (the edge speaks another version);
// UnknownSandbox passes through to the client as the 404 it is.
package nodeproto

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/iam"
)

// Version is the node protocol this build speaks. A request that speaks another is refused with
// WrongVersion; bump it when a header's meaning or the Caller's fields change incompatibly.
const Version = 1

// The headers of the protocol. A server removes every one of them from what a client sends
// before it forwards a request, and from an edge's answer before it returns one.
const (
	HeaderVersion = "Corral-Node-Protocol"
	HeaderCaller  = "Corral-Node-Caller"
	HeaderRefusal = "Corral-Node-Refusal"
)

// Headers lists the protocol's headers, for stripping them at the cluster's edge with clients.
var Headers = []string{HeaderVersion, HeaderCaller, HeaderRefusal, HeaderSeal, HeaderResolution}

// maxCaller bounds an encoded caller: a principal with grants on many projects stays far below.
const maxCaller = 256 << 10

// Caller is an authenticated end user as the server found it: the token's record less its
// secret, and what the principal's grants give on each project (canonical path → permissions)
// within the token's scope.
type Caller struct {
	TokenID     string              `json:"token_id"`
	Principal   string              `json:"principal"`
	ProjectID   string              `json:"project_id"`
	ProjectPath string              `json:"project_path"`
	Perms       iam.Perm            `json:"perms"`
	Role        string              `json:"role,omitempty"`
	Parent      string              `json:"parent,omitempty"`
	CreatedAt   time.Time           `json:"created_at"`
	ExpiresAt   time.Time           `json:"expires_at,omitzero"`
	Held        map[string]iam.Perm `json:"held"`
	// Sandbox is the sandbox the request's path names and its project as the server read it
	// for this request; nil when the path names none or the server did not find it. The edge
	// authorises the request on that project, and so follows project moves without a read of
	// its own.
	Sandbox *SandboxProject `json:"sandbox,omitempty"`
	// Node and Until are what a sealed caller (SetSealedCaller) holds for: the edge it was
	// sent to, and until when.
	Node  string    `json:"node,omitempty"`
	Until time.Time `json:"until,omitzero"`
}

// SandboxProject names a sandbox and the canonical path of its project.
type SandboxProject struct {
	ID      string `json:"id"`
	Project string `json:"project"`
}

// SetCaller makes h carry c and this build's protocol version, replacing whatever it carried.
func SetCaller(h http.Header, c *Caller) error {
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode the caller for an edge: %w", err)
	}
	h.Set(HeaderVersion, strconv.Itoa(Version))
	h.Set(HeaderCaller, base64.RawURLEncoding.EncodeToString(b))
	return nil
}

// CallerOf returns the caller a server sent with r. It fails with ErrVersion (a WrongVersion refusal) when r
// speaks no protocol or another version, and with ErrUnauthorized when the caller is missing or
// malformed. Only an edge whose peers are verified servers may call it.
func CallerOf(r *http.Request) (*Caller, error) {
	if err := CheckVersion(r.Header); err != nil {
		return nil, err
	}
	enc := r.Header.Get(HeaderCaller)
	switch {
	case enc == "":
		return nil, fmt.Errorf("the request carries no caller (%s): a corral server authenticates every request it sends an edge: %w", HeaderCaller, errdefs.ErrUnauthorized)
	case len(enc) > maxCaller:
		return nil, fmt.Errorf("the request's caller is %d bytes encoded, over the %d allowed: %w", len(enc), maxCaller, errdefs.ErrUnauthorized)
	}
	b, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return nil, fmt.Errorf("the request's caller is not base64url: %v: %w", err, errdefs.ErrUnauthorized)
	}
	var c Caller
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("the request's caller is not one: %v: %w", err, errdefs.ErrUnauthorized)
	}
	if c.TokenID == "" || c.Principal == "" {
		return nil, fmt.Errorf("the request's caller lacks its token or principal: %w", errdefs.ErrUnauthorized)
	}
	return &c, nil
}

// ErrVersion is why an edge refuses a request that does not speak its protocol version: the
// server and the edge are of releases that cannot talk (upgrade the older side).
var ErrVersion = fmt.Errorf("node protocol version mismatch: %w", errdefs.ErrUnavailable)

// CheckVersion fails with ErrVersion unless h speaks this build's protocol version.
func CheckVersion(h http.Header) error {
	v := h.Get(HeaderVersion)
	switch {
	case v == "":
		return fmt.Errorf("this edge speaks node protocol %d and serves only corral servers that speak it; the request speaks none (a server older than this edge? upgrade the servers): %w", Version, ErrVersion)
	case v != strconv.Itoa(Version):
		return fmt.Errorf("this edge speaks node protocol %d; the request speaks %q (upgrade the older of server and edge): %w", Version, v, ErrVersion)
	}
	return nil
}

// Refusal is why an edge turned a request down, as the server acts on it.
type Refusal string

// The refusals.
const (
	None           Refusal = ""
	NodeFull       Refusal = "node_full"       // no room, draining, or labels that do not match: place elsewhere
	StaleEpoch     Refusal = "stale_epoch"     // the edge's incarnation was fenced off: place elsewhere
	WrongVersion   Refusal = "version"         // the edge speaks another protocol version: place elsewhere
	UnknownSandbox Refusal = "unknown_sandbox" // the edge has no such sandbox: 404 to the client
)

// RefusalOf returns the refusal err is, or None for any other failure.
func RefusalOf(err error) Refusal {
	switch {
	case err == nil:
		return None
	case errors.Is(err, errdefs.ErrNodeFull):
		return NodeFull
	case errors.Is(err, errdefs.ErrStaleEpoch):
		return StaleEpoch
	case errors.Is(err, ErrVersion):
		return WrongVersion
	case errors.Is(err, errdefs.ErrUnknownSandbox):
		return UnknownSandbox
	}
	return None
}

// Annotate marks an error answer to a request of the protocol with the refusal err is, if any.
// It does nothing for requests that do not speak the protocol (a client's, on `corral up`).
func Annotate(w http.ResponseWriter, r *http.Request, err error) {
	if r.Header.Get(HeaderVersion) == "" {
		return
	}
	if ref := RefusalOf(err); ref != None {
		w.Header().Set(HeaderRefusal, string(ref))
	}
}

// Refused returns the refusal an edge's answer carries, or None. A value this build does not
// know is None: the answer is then what its status says.
func Refused(h http.Header) Refusal {
	switch ref := Refusal(h.Get(HeaderRefusal)); ref {
	case NodeFull, StaleEpoch, WrongVersion, UnknownSandbox:
		return ref
	}
	return None
}

// Strip removes the protocol's headers from h.
func Strip(h http.Header) {
	for _, k := range Headers {
		h.Del(k)
	}
}
