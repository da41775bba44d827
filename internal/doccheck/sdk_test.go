package doccheck_test

import (
	"testing"

	"github.com/corral-dev/corral/internal/doccheck"
)

// TestSDKExportedDocs checks the Go SDK, the public face of Corral. The SDK is a module of its
// own (sdk/go) that cannot import this one, so the check runs here, on its files.
func TestSDKExportedDocs(t *testing.T) {
	doccheck.Exported(t, "../../sdk/go")
}
