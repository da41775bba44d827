package agentrpc

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/corral-dev/corral/internal/errdefs"
)

// ForkIdentity is what a microvm restored from another VM's memory (a copy of a fork) takes on
// in place of its source's: the kernel it resumes still holds the source's address, route,
// hostname, resolver and entropy pool. The host sends it once the copy's agent answers, before
// the copy is handed out.
type ForkIdentity struct {
	// MAC picks the network interface to readdress; empty: the VM has none.
	MAC string `json:"mac,omitempty"`
	// Address is the interface's new address with its prefix length (10.0.0.2/30), Gateway the
	// new default route's next hop; both set with MAC.
	Address string `json:"address,omitempty"`
	Gateway string `json:"gateway,omitempty"`
	// Hostname is the VM's new hostname.
	Hostname string `json:"hostname"`
	// ResolvConf, when set, replaces /etc/resolv.conf (the resolver is the gateway).
	ResolvConf string `json:"resolv_conf,omitempty"`
	// Seed is mixed into the kernel's entropy pool, which then reseeds: copies must not draw the
	// same random numbers. Now (Unix nanoseconds) sets the clock, which stood still while the
	// source's memory was saved and restored; 0 leaves it.
	Seed []byte `json:"seed,omitempty"`
	Now  int64  `json:"now,omitempty"`
}

// Validate reports the first field that is out of range.
func (f *ForkIdentity) Validate() error {
	if f.Hostname == "" || len(f.Hostname) > 64 {
		return errdefs.Invalid("hostname", "%q: want 1 to 64 bytes", f.Hostname)
	}
	if f.MAC != "" {
		if _, err := netip.ParsePrefix(f.Address); err != nil {
			return errdefs.Invalid("address", "%q: %v", f.Address, err)
		}
		if _, err := netip.ParseAddr(f.Gateway); err != nil {
			return errdefs.Invalid("gateway", "%q: %v", f.Gateway, err)
		}
	}
	if len(f.ResolvConf) > 64<<10 || len(f.Seed) > 512 {
		return errdefs.Invalid("identity", "resolv_conf over 64 KiB or seed over 512 bytes")
	}
	return nil
}

// SetForkIdentity has the agent of a microvm restored from another's memory take on id. An
// agent that is not a microvm's refuses it (errdefs.ErrInvalid).
func (c *Client) SetForkIdentity(ctx context.Context, id ForkIdentity) error {
	_, err := c.roundTrip(ctx, &request{Op: opForkIdentity, Identity: &id})
	return err
}

// forkIdentity applies id through Config.ForkIdentity.
func (s *Server) forkIdentity(ctx context.Context, id *ForkIdentity) error {
	if s.cfg.ForkIdentity == nil {
		return errdefs.Invalid("op", "forkidentity applies to a microvm's agent only")
	}
	if id == nil {
		return errdefs.Invalid("identity", "missing")
	}
	if err := id.Validate(); err != nil {
		return err
	}
	if err := s.cfg.ForkIdentity(ctx, *id); err != nil {
		return fmt.Errorf("take on the fork's identity: %w", err)
	}
	return nil
}
