package conformance_test

import (
	"testing"

	"github.com/corral-dev/corral/sdk/go/corraltest"
	"github.com/corral-dev/corral/sdk/go/corraltest/conformance"
)

// TestFake runs the suite against the SDK's fake server; internal/e2e's TestAPIConformance runs
// it against a real `corral up`.
func TestFake(t *testing.T) {
	srv := corraltest.NewServer(t)
	conformance.Run(t, conformance.Target{URL: srv.URL, Token: srv.Token, Client: srv.Client(), Base: corraltest.DefaultBase})
}
