// Package envinstall builds and publishes the environments Corral ships as recipes
// (`corral env install NAME`): a recipe (recipes/NAME/recipe.json and recipes/NAME/files/,
// embedded in the binary) names Debian packages to install on the Debian base, a check to run
// after them, files to add, and the services its sandboxes start (corral.Service). A recipe
// makes two toolkit layers: NAME-packages:KEY, what apt installed, built once per host and
// cached under <cache>/recipes/NAME-packages-KEY/ (KEY hashes the base's key, the builder, the
// packages and the check), and NAME:KEY2, the files and services, made on each install (it is
// small), so changing a recipe's files rebuilds nothing. Install publishes the base and both
// layers and saves an environment of the recipe's name.
//
// The build is a chroot, not a sandbox: build.sh unpacks the base under an overlay, runs apt in
// a chroot of it and archives the overlay's upper directory. It needs root (mounts, chroot)
// and reaches Debian's mirror from the host, as debootstrap does for the base; the recipe's
// inputs are the project's own, never a user's. Adding a recipe is a directory under recipes/
// and a test that installs it.
package envinstall

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/layers"
	"github.com/corral-dev/corral/internal/lazyregexp"
	corral "github.com/corral-dev/corral/sdk/go"
)

//go:embed recipes
var recipes embed.FS

//go:embed build.sh
var buildScript []byte

//go:embed debian-base.sh
var baseScript []byte

// layerExclude is what a built layer leaves out: what apt and the chroot leave that is no part
// of a toolkit (package lists, the download cache, logs, the host's resolv.conf mount point,
// scratch), documentation (as the Debian base does), and Boost's 140 MB of C++ headers, which
// bookworm's python3-scipy pulls in through python3-pythran and nothing in a sandbox compiles
// against.
var layerExclude = []string{"etc/resolv.conf", "var/lib/apt/lists", "var/cache/apt", "var/log", "tmp", "dev", "proc", "run",
	"usr/share/doc", "usr/share/man", "usr/share/info", "usr/include/boost"}

// builderVersion changes the key of every recipe when the way layers are built changes.
const builderVersion = "1"

// Recipe is one installable environment.
type Recipe struct {
	Name        string           `json:"-"`
	Description string           `json:"description"`
	Packages    []string         `json:"packages"`
	Check       string           `json:"check,omitempty"`
	Services    []corral.Service `json:"services,omitempty"`
	// raw is recipe.json as embedded; files its files directory.
	raw   []byte
	files fs.FS
}

var (
	nameRE    = lazyregexp.New(`^[a-z0-9][a-z0-9-]{0,62}$`)
	packageRE = lazyregexp.New(`^[a-z0-9][a-z0-9+.-]+$`)
)

// Names lists the recipes, sorted.
func Names() []string {
	ents, _ := recipes.ReadDir("recipes")
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out
}

// Load returns recipe name.
func Load(name string) (*Recipe, error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("recipe %q: not a recipe name (recipes: %s)", name, strings.Join(Names(), ", "))
	}
	raw, err := recipes.ReadFile("recipes/" + name + "/recipe.json")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no recipe %q (recipes: %s)", name, strings.Join(Names(), ", "))
	}
	if err != nil {
		return nil, err
	}
	r := &Recipe{Name: name, raw: raw}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(r); err != nil {
		return nil, fmt.Errorf("recipe %s: %w", name, err)
	}
	for _, p := range r.Packages {
		if !packageRE.MatchString(p) {
			return nil, fmt.Errorf("recipe %s: %q is not a Debian package name", name, p)
		}
	}
	if sub, err := fs.Sub(recipes, "recipes/"+name+"/files"); err == nil {
		if _, err := fs.Stat(sub, "."); err == nil {
			r.files = sub
		}
	}
	if len(r.Services) > 0 && r.files == nil {
		return nil, fmt.Errorf("recipe %s: services come with the recipe's files layer, and it has no files", name)
	}
	return r, nil
}

// PackagesKey hashes the inputs of the recipe's packages layer on the base whose key is
// baseKey: the builder, its exclusions, the packages and the check. The layer is cached under it
// and published as NAME-packages:KEY, so a changed package list is a new version and an
// unchanged one is found in the cache, whatever happens to the recipe's files.
func (r *Recipe) PackagesKey(baseKey string) string {
	h := sha256.New()
	fmt.Fprintf(h, "builder %s\nbase %s\nexclude %q\npackages %q\ncheck %q\n", builderVersion, baseKey, layerExclude, r.Packages, r.Check)
	h.Write(buildScript)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// FilesKey hashes the recipe's files layer: its files and recipe.json (the services), on top
// of the packages layer packagesKey. The layer is published as NAME:KEY.
func (r *Recipe) FilesKey(packagesKey string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "packages %s\n", packagesKey)
	h.Write(r.raw)
	if r.files != nil {
		err := fs.WalkDir(r.files, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := fs.ReadFile(r.files, p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "file %s %d %x\n", p, len(b), sha256.Sum256(b))
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// Options configure Build and Install.
type Options struct {
	// CacheDir holds the base (debian-base/) and the recipes' layers (recipes/); default
	// /var/cache/corral (CORRAL_CACHE).
	CacheDir string
	// BaseTar, when set, is the Debian base's tarball to build on, instead of the cached one.
	BaseTar string
	// Log receives progress lines.
	Log io.Writer
}

func (o *Options) fill() {
	if o.CacheDir == "" {
		o.CacheDir = os.Getenv("CORRAL_CACHE")
	}
	if o.CacheDir == "" {
		o.CacheDir = "/var/cache/corral"
	}
	if o.Log == nil {
		o.Log = io.Discard
	}
}

// Built is a recipe's layers on this host: the Debian packages installed on the base, and the
// recipe's files (two layers, so that a change of the files, such as a server's code, costs no
// rebuild of the packages).
type Built struct {
	Recipe *Recipe
	// BaseTar is the Debian base the layers were built on; BaseKey its cache key.
	BaseTar, BaseKey string
	// Key is the packages layer's version; LayerTar its archive (cached).
	Key, LayerTar string
	// FilesKey is the files layer's version; FilesTar its archive ("" when the recipe has no
	// files), made in a temporary directory the caller removes with FilesDir.
	FilesKey, FilesTar, FilesDir string
	// Cached: the packages layer came from the cache.
	Cached bool
}

// Build returns recipe r's layers, building the packages layer (as root) when the cache lacks
// it. The caller removes b.FilesDir.
func Build(ctx context.Context, r *Recipe, o Options) (*Built, error) {
	o.fill()
	baseTar := o.BaseTar
	if baseTar == "" {
		var err error
		if baseTar, err = debianBase(ctx, o); err != nil {
			return nil, err
		}
	}
	baseKey := filepath.Base(filepath.Dir(baseTar))
	if o.BaseTar != "" {
		sum, err := fileSum(baseTar)
		if err != nil {
			return nil, err
		}
		baseKey = sum[:16]
	}
	key := r.PackagesKey(baseKey)
	filesKey, err := r.FilesKey(key)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(o.CacheDir, "recipes", r.Name+"-packages-"+key)
	b := &Built{Recipe: r, BaseTar: baseTar, BaseKey: baseKey, Key: key, LayerTar: filepath.Join(dir, "layer.tar"), FilesKey: filesKey}
	if r.files != nil {
		if b.FilesDir, err = os.MkdirTemp("", "corral-recipe-"); err != nil {
			return nil, err
		}
		if err := filesLayer(ctx, r.files, b.FilesDir); err != nil {
			os.RemoveAll(b.FilesDir)
			return nil, fmt.Errorf("recipe %s: the files layer: %w", r.Name, err)
		}
		b.FilesTar = filepath.Join(b.FilesDir, "layer.tar")
	}
	if st, err := os.Stat(b.LayerTar); err == nil && st.Size() > 0 {
		b.Cached = true
		fmt.Fprintf(o.Log, "%s: packages layer %s found in %s\n", r.Name, key, dir)
		return b, nil
	}
	ok := false
	defer func() {
		if !ok && b.FilesDir != "" {
			os.RemoveAll(b.FilesDir)
		}
	}()
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("build recipe %s: needs root (an overlay mount and a chroot); run as root once on this host, later installs use the cache in %s", r.Name, dir)
	}
	fmt.Fprintf(o.Log, "%s: building the packages layer %s once on this host (Debian packages: %s)\n", r.Name, key, strings.Join(r.Packages, " "))
	start := time.Now()
	if err := os.MkdirAll(filepath.Join(o.CacheDir, "recipes"), 0o755); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(filepath.Join(o.CacheDir, "recipes"), ".build-"+r.Name+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	cmd := exec.CommandContext(ctx, "bash", "-s")
	cmd.Stdin = bytes.NewReader(buildScript)
	cmd.Env = append(os.Environ(), "BASE_TAR="+baseTar, "WORK="+work, "PACKAGES="+strings.Join(r.Packages, " "), "CHECK="+r.Check)
	pw := &prefixWriter{w: o.Log, prefix: "  " + r.Name + ": "}
	cmd.Stdout, cmd.Stderr = pw, pw
	// Cancelled: SIGTERM to the script's group, whose trap unmounts the chroot's mounts.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = time.Minute
	err = cmd.Run()
	pw.Flush()
	if err != nil {
		return nil, fmt.Errorf("build recipe %s: %w", r.Name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	tmp := b.LayerTar + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return nil, err
	}
	err = layers.WriteTarExcluding(ctx, filepath.Join(work, "upper"), f, layerExclude)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, b.LayerTar)
	}
	if err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("build recipe %s: archive the layer: %w", r.Name, err)
	}
	fmt.Fprintf(o.Log, "%s: built the packages layer %s in %s\n", r.Name, key, time.Since(start).Round(time.Second))
	ok = true
	return b, nil
}

// filesLayer writes the recipe's files to dir/files and their archive to dir/layer.tar.
func filesLayer(ctx context.Context, files fs.FS, dir string) error {
	tree := filepath.Join(dir, "files")
	if err := writeFiles(files, tree); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "layer.tar"))
	if err != nil {
		return err
	}
	err = layers.WriteTar(ctx, tree, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// debianBase runs the embedded debian-base.sh (the same as scripts/debian-base.sh) and
// returns the path of the cached base tarball.
func debianBase(ctx context.Context, o Options) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", "-s")
	cmd.Stdin = bytes.NewReader(baseScript)
	cmd.Env = append(os.Environ(), "CORRAL_CACHE="+o.CacheDir)
	var out bytes.Buffer
	cmd.Stdout = &out
	pw := &prefixWriter{w: o.Log, prefix: "  "}
	cmd.Stderr = pw
	err := cmd.Run()
	pw.Flush()
	if err != nil {
		return "", fmt.Errorf("build the Debian base: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	return lines[len(lines)-1], nil
}

// writeFiles copies the recipe's files to dir: directories 0755, files 0644, or 0755 when
// they start with "#!".
func writeFiles(src fs.FS, dir string) error {
	return fs.WalkDir(src, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, filepath.FromSlash(p))
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := fs.ReadFile(src, p)
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if bytes.HasPrefix(b, []byte("#!")) {
			mode = 0o755
		}
		return os.WriteFile(dst, b, mode)
	})
}

func fileSum(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Result is what Install published.
type Result struct {
	Environment corral.Environment
	Base        string   // NAME:VERSION
	Toolkits    []string // NAME-packages:KEY, then NAME:KEY (the files and services)
	Cached      bool
}

// Install builds recipe r (or finds it in the cache) and publishes, through c, the Debian base
// as base:debian-12 (or base:debian-12-KEY when that name holds another build), the recipe's
// layer as toolkit NAME:KEY with its services, both public, and the environment envName
// (default: the recipe's name) composing them; an environment of that name is replaced.
func Install(ctx context.Context, c *corral.Client, r *Recipe, envName string, o Options) (*Result, error) {
	o.fill()
	if envName == "" {
		envName = r.Name
	}
	b, err := Build(ctx, r, o)
	if err != nil {
		return nil, err
	}
	if b.FilesDir != "" {
		defer os.RemoveAll(b.FilesDir)
	}
	base, err := publish(ctx, c, o.Log, b.BaseTar, "base", "debian-12", corral.KindBase, nil)
	if corral.IsConflict(err) {
		base, err = publish(ctx, c, o.Log, b.BaseTar, "base", "debian-12-"+b.BaseKey, corral.KindBase, nil)
	}
	if err != nil {
		return nil, err
	}
	var cfg *corral.ImageConfig
	if len(r.Services) > 0 {
		cfg = &corral.ImageConfig{Services: r.Services}
	}
	toolkits := []string{}
	pkgs, err := publish(ctx, c, o.Log, b.LayerTar, r.Name+"-packages", b.Key, corral.KindToolkit, nil)
	if err != nil {
		return nil, err
	}
	toolkits = append(toolkits, pkgs)
	if b.FilesTar != "" {
		tk, err := publish(ctx, c, o.Log, b.FilesTar, r.Name, b.FilesKey, corral.KindToolkit, cfg)
		if err != nil {
			return nil, err
		}
		toolkits = append(toolkits, tk)
	}
	env := corral.Environment{Name: envName, Base: base, Toolkits: toolkits}
	saved, err := c.SaveEnvironment(ctx, env)
	if corral.IsConflict(err) {
		// Another composition under the name (an older build of the recipe): replaced.
		if err = c.DeleteEnvironment(ctx, envName); err == nil {
			saved, err = c.SaveEnvironment(ctx, env)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("save environment %s: %w", envName, err)
	}
	fmt.Fprintf(o.Log, "environment %s: %s + %s\n", envName, base, strings.Join(toolkits, " + "))
	return &Result{Environment: *saved, Base: base, Toolkits: toolkits, Cached: b.Cached}, nil
}

// publish imports the tarball at p as name:version (public) unless that version is already
// published (toolkits, whose version is a hash of their inputs), and returns its reference.
// The base is imported again: the same content is a no-op, another build a conflict.
func publish(ctx context.Context, c *corral.Client, log io.Writer, p, name, version, kind string, cfg *corral.ImageConfig) (string, error) {
	ref := name + ":" + version
	if _, err := c.Layer(ctx, name, version); err == nil && kind == corral.KindToolkit {
		// Published before: a toolkit's version is its inputs' hash, so it holds this content.
		fmt.Fprintf(log, "%s is published already\n", ref)
		return ref, nil
	}
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	fmt.Fprintf(log, "publishing %s (%s, %d MB)\n", ref, kind, st.Size()>>20)
	start := time.Now()
	if _, err := c.ImportLayerWith(ctx, name, version, kind, corral.ImportOptions{ImageConfig: cfg, Public: true}, f); err != nil {
		return "", fmt.Errorf("publish %s: %w", ref, err)
	}
	fmt.Fprintf(log, "published %s in %s\n", ref, time.Since(start).Round(100*time.Millisecond))
	return ref, nil
}

// prefixWriter writes each line to w with a prefix.
type prefixWriter struct {
	w      io.Writer
	prefix string
	buf    []byte
}

// Write buffers b and writes its complete lines.
func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf[:i])
		p.buf = p.buf[i+1:]
	}
	return len(b), nil
}

// Flush writes a last, unterminated line.
func (p *prefixWriter) Flush() {
	if len(p.buf) > 0 {
		fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf)
		p.buf = nil
	}
}
