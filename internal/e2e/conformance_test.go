package e2e

import (
	"testing"

	"github.com/corral-dev/corral/sdk/go/corraltest/conformance"
)

// TestAPIConformance runs the API conformance suite against a real `corral up`; the SDK module
// runs the same suite against its fake server (sdk/go/corraltest), so the two cannot drift apart
// unnoticed.
func TestAPIConformance(t *testing.T) {
	p := withBase(t)
	conformance.Run(t, conformance.Target{URL: p.URL, Token: p.Token, Client: p.Client, Base: "base:test"})
}
