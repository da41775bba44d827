package agentrpc

import (
	"context"
	"errors"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

// TestForkIdentity: an agent without Config.ForkIdentity refuses the operation; one with it
// gets the identity as sent, and bad identities are refused before it runs.
func TestForkIdentity(t *testing.T) {
	ctx := testCtx(t)
	id := ForkIdentity{MAC: "52:54:00:c0:44:01", Address: "10.0.0.6/30", Gateway: "10.0.0.5", Hostname: "sb-copy",
		ResolvConf: "nameserver 10.0.0.5\n", Seed: []byte{1, 2, 3}, Now: 42}

	c, _ := startServer(t, nil)
	if err := c.SetForkIdentity(ctx, id); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("an agent without the hook: %v, want invalid", err)
	}

	var got []ForkIdentity
	c, _ = startServer(t, func(cfg *Config) {
		cfg.ForkIdentity = func(_ context.Context, id ForkIdentity) error {
			got = append(got, id)
			if id.Hostname == "fails" {
				return errors.New("no such interface")
			}
			return nil
		}
	})
	if err := c.SetForkIdentity(ctx, id); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Address != id.Address || got[0].Hostname != id.Hostname || string(got[0].Seed) != string(id.Seed) || got[0].Now != 42 {
		t.Fatalf("the hook got %+v, want %+v", got, id)
	}
	for name, bad := range map[string]ForkIdentity{
		"no hostname": {MAC: id.MAC, Address: id.Address, Gateway: id.Gateway},
		"bad address": {MAC: id.MAC, Address: "10.0.0.6", Gateway: id.Gateway, Hostname: "h"},
		"bad gateway": {MAC: id.MAC, Address: id.Address, Gateway: "gw", Hostname: "h"},
		"long seed":   {Hostname: "h", Seed: make([]byte, 513)},
	} {
		if err := c.SetForkIdentity(ctx, bad); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v, want invalid", name, err)
		}
	}
	if len(got) != 1 {
		t.Errorf("the hook ran for a refused identity: %d calls", len(got))
	}
	if err := c.SetForkIdentity(ctx, ForkIdentity{Hostname: "fails"}); err == nil {
		t.Error("the hook's failure was not reported")
	}
}
