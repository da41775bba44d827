package proxy

import (
	"testing"

	"github.com/corral-dev/corral/internal/doccheck"
)

// TestExportedDocs checks that every exported identifier of the package has a doc comment:
// the edge is written against them.
func TestExportedDocs(t *testing.T) { doccheck.Exported(t, ".") }
