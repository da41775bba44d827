package corral_test

import (
	"testing"

	"github.com/corral-dev/corral/internal/doccheck"
)

// TestExportedDocs checks that every exported identifier of the package has a doc comment:
// this package is the public face of Corral.
func TestExportedDocs(t *testing.T) { doccheck.Exported(t, ".") }
