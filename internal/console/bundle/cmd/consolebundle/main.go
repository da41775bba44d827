// Command consolebundle rebuilds internal/console/dist from internal/console/web (go generate
// ./internal/console, or make console, which first installs the pinned npm packages).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/corral-dev/corral/internal/console/bundle"
)

func main() {
	// go generate runs in the directory of the file with the directive: internal/console.
	dir := flag.String("dir", ".", "the console package's directory (internal/console)")
	flag.Parse()
	err := bundle.Build(*dir, filepath.Join(*dir, "dist"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
