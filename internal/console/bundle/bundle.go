// Package bundle builds the web console's dist/ from its sources in web/ with esbuild's Go API:
// web/src/main.js and everything it imports (the npm packages pinned by web/package-lock.json,
// installed in web/node_modules by npm ci) become dist/app.js and dist/app.css. It is a build
// tool: only go generate and the console's tests link it, never bin/corral.
package bundle

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/evanw/esbuild/pkg/api"
)

// HashFile is the file in dist/ naming the hash of the sources the bundle was built from.
const HashFile = "SOURCES.sha256"

// SourceHash hashes what the bundle is made of: every file under web/src, the lock file that pins
// the npm packages, and this builder's own source (so a change to how it bundles shows too).
func SourceHash(consoleDir string) (string, error) {
	var names []string
	src := filepath.Join(consoleDir, "web", "src")
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		names = append(names, p)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("list console sources: %w", err)
	}
	slices.Sort(names)
	names = append(names, filepath.Join(consoleDir, "web", "package-lock.json"), filepath.Join(consoleDir, "bundle", "bundle.go"))
	h := sha256.New()
	for _, p := range names {
		b, err := os.ReadFile(p)
		if err != nil {
			return "", fmt.Errorf("hash console sources: %w", err)
		}
		rel, _ := filepath.Rel(consoleDir, p)
		fmt.Fprintf(h, "%s %d\n", filepath.ToSlash(rel), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Build bundles consoleDir/web into outDir (replacing what is there) and writes HashFile.
// web/node_modules must hold the pinned packages (npm ci in web/).
func Build(consoleDir, outDir string) error {
	consoleDir, err := filepath.Abs(consoleDir)
	if err == nil {
		outDir, err = filepath.Abs(outDir)
	}
	if err != nil {
		return fmt.Errorf("bundle console: %w", err)
	}
	web := filepath.Join(consoleDir, "web")
	if _, err := os.Stat(filepath.Join(web, "node_modules", "@xterm", "xterm")); err != nil {
		return errors.New("bundle console: web/node_modules lacks the pinned packages: run npm ci in internal/console/web (make console does)")
	}
	tmp, err := os.MkdirTemp(filepath.Dir(outDir), ".dist-")
	if err != nil {
		return fmt.Errorf("bundle console: %w", err)
	}
	defer os.RemoveAll(tmp)
	res := api.Build(api.BuildOptions{
		EntryPointsAdvanced: []api.EntryPoint{{InputPath: filepath.Join(web, "src", "main.js"), OutputPath: "app"}},
		AbsWorkingDir:       web,
		Bundle:              true,
		Write:               true,
		Outdir:              tmp,
		// An ES module (index.html loads it with type="module"): noVNC's core/util/browser.js
		// awaits at its top level (its H.264 decoder probe), which only a module can.
		Format:            api.FormatESModule,
		Target:            api.ES2020,
		Supported:         map[string]bool{"top-level-await": true},
		Platform:          api.PlatformBrowser,
		MinifyWhitespace:  true,
		MinifyIdentifiers: true,
		MinifySyntax:      true,
		LegalComments:     api.LegalCommentsEndOfFile,
		Charset:           api.CharsetUTF8,
		Loader:            map[string]api.Loader{".woff": api.LoaderDataURL, ".woff2": api.LoaderDataURL},
		LogLevel:          api.LogLevelSilent,
	})
	if len(res.Errors) > 0 {
		var msgs []string
		for _, m := range api.FormatMessages(res.Errors, api.FormatMessagesOptions{Kind: api.ErrorMessage}) {
			msgs = append(msgs, strings.TrimSpace(m))
		}
		return fmt.Errorf("bundle console:\n%s", strings.Join(msgs, "\n"))
	}
	index, err := os.ReadFile(filepath.Join(web, "src", "index.html"))
	if err != nil {
		return fmt.Errorf("bundle console: %w", err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "index.html"), index, 0o644); err != nil {
		return fmt.Errorf("bundle console: %w", err)
	}
	sum, err := SourceHash(consoleDir)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, HashFile), []byte(sum+"\n"), 0o644); err != nil {
		return fmt.Errorf("bundle console: %w", err)
	}
	if err := os.RemoveAll(outDir); err != nil {
		return fmt.Errorf("bundle console: %w", err)
	}
	if err := os.Rename(tmp, outDir); err != nil {
		return fmt.Errorf("bundle console: %w", err)
	}
	return os.Chmod(outDir, 0o755)
}
