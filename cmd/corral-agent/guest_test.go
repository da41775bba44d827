package main

import (
	"strings"
	"testing"
)

// TestGuestAgentArgs: the guest parses the host's serve arguments with serve's flags and refuses
// those that name another channel.
func TestGuestAgentArgs(t *testing.T) {
	for _, tt := range []struct {
		args  []string
		calls bool
		err   string // "" for accepted
	}{
		{[]string{"serve"}, false, ""},
		{[]string{"serve", "--retain-exited", "8", "--retain-for", "1m"}, false, ""},
		{[]string{"serve", "--calls"}, true, ""},
		{[]string{"serve", "-calls=1"}, true, ""},
		{nil, false, "want serve"},
		{[]string{"version"}, false, "want serve"},
		{[]string{"serve", "--fd", "3"}, false, "do not apply"},
		{[]string{"serve", "--stdio"}, false, "do not apply"},
		{[]string{"serve", "--bogus"}, false, "bad serve flags: flag provided but not defined"},
		{[]string{"serve", "--retain-exited", "-1"}, false, "must not be negative"},
		{[]string{"serve", "extra"}, false, "no arguments"},
		// A warm pool's VM: the hostname is set at the claim; never with --calls.
		{[]string{"serve", "--claimable"}, false, ""},
		{[]string{"serve", "--claimable", "--calls"}, false, "without --calls"},
	} {
		serve, calls, err := guestAgent(tt.args)
		switch {
		case tt.err == "" && (err != nil || serve == nil || calls != tt.calls):
			t.Errorf("guestAgent(%q) = calls %v, %v; want calls %v", tt.args, calls, err, tt.calls)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("guestAgent(%q) = %v, want an error with %q", tt.args, err, tt.err)
		}
	}
	// A vm sandbox's agent (the machine's own service) is never claimable.
	if _, _, err := machineAgent([]string{"serve", "--claimable"}); err == nil || !strings.Contains(err.Error(), "microvm") {
		t.Errorf("machineAgent(serve --claimable) = %v, want an error", err)
	}
}
