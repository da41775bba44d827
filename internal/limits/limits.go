// Package limits owns the defaults and bounds of every limit a sandbox carries (CPUs, memory,
// processes, disk, open files, output kept per command) and of its lifetimes (ttl, idle_ttl,
// auto_pause_after), per tier, in one table. Admission resolves a create's limits here once,
// before anything is allocated; the runtimes get resolved limits and only check invariants.
//
// A request's zero field takes the tier's default; a field outside the tier's bounds is an
// errdefs.ErrInvalid error naming it ("limits.memory_bytes: at least 128 MiB on microvm, got
// 64 MiB"). The node configures the default and the ceiling of the writable disk
// (--sandbox-disk, --max-sandbox-disk) and the default and longest TTL (--default-ttl,
// --max-ttl); every other bound is fixed here.
package limits

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// The tiers the table knows (the edge's tier names).
const (
	TierContainer = "container"
	TierFncall    = "fncall"
	TierMicroVM   = "microvm"
	TierVM        = "vm"
)

// Tiers lists the tiers in the order the documentation shows them.
var Tiers = []string{TierContainer, TierFncall, TierMicroVM, TierVM}

// Limits are a sandbox's limits, as a create asks for them and as Resolve fills them in. It is
// the API's Limits (sdk/go) field for field, tag for tag, but the package does not import the SDK
// (issue 29 item 5): the edge and the cluster server convert with a plain type conversion, which
// stops compiling the day a field or tag changes on one side only. apiserver.TestLimitsConversion
// holds the JSON equal.
type Limits struct {
	// CPUs is a CPU quota in cores (0.5 = half a core).
	CPUs float64 `json:"cpus,omitempty"`
	// MemoryBytes is the memory limit (processes and page cache, without swap).
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	// Pids caps the number of processes and threads.
	Pids int64 `json:"pids,omitempty"`
	// DiskBytes caps the writable layer (enforced by a filesystem of that size).
	DiskBytes int64 `json:"disk_bytes,omitempty"`
	// OpenFiles is RLIMIT_NOFILE for every process in the sandbox.
	OpenFiles int64 `json:"open_files,omitempty"`
	// OutputBytes caps the output kept per command (stdout and stderr together).
	OutputBytes int64 `json:"output_bytes,omitempty"`
}

// Bounds are one tier's limits: Default fills a zero field of a request, Min and Max bound a
// field the request sets. Every field of all three is set.
type Bounds struct {
	Default, Min, Max Limits
}

// The defaults and ceilings every tier shares, and the node's disk and TTL settings when its
// configuration names none.
const (
	DefaultCPUs        = 1.0
	MaxCPUs            = 64.0
	DefaultMemoryBytes = 1 << 30
	MaxMemoryBytes     = 256 << 30
	DefaultPids        = 1024
	MaxPids            = 1 << 20
	DefaultDiskBytes   = 1 << 30
	MaxDiskBytes       = 64 << 30
	DefaultOpenFiles   = 4096
	MaxOpenFiles       = 1 << 20
	DefaultOutputBytes = 16 << 20
	MaxOutputBytes     = 1 << 30

	// DiskCeiling bounds what a node may configure as its largest disk (--max-sandbox-disk).
	DiskCeiling = 1 << 50

	DefaultTTL = time.Hour
	MaxTTL     = 7 * 24 * time.Hour
	// MinTTL is the shortest ttl, idle_ttl or auto_pause_after.
	MinTTL = time.Second

	// ShmBytes is the size of a container's /dev/shm (not a request field; charged to its
	// memory like any tmpfs).
	ShmBytes = 64 << 20
)

// minimums are each tier's least limits. A microvm's kernel and agent need about 100 MiB and
// its writable disk holds an ext4 journal; a vm boots a full distribution's init.
var minimums = map[string]Limits{
	TierContainer: {CPUs: 0.01, MemoryBytes: 16 << 20, Pids: 8, DiskBytes: 16 << 20, OpenFiles: 64, OutputBytes: 4 << 10},
	TierFncall:    {CPUs: 0.01, MemoryBytes: 16 << 20, Pids: 8, DiskBytes: 16 << 20, OpenFiles: 64, OutputBytes: 4 << 10},
	TierMicroVM:   {CPUs: 0.01, MemoryBytes: 128 << 20, Pids: 8, DiskBytes: 64 << 20, OpenFiles: 64, OutputBytes: 4 << 10},
	TierVM:        {CPUs: 0.01, MemoryBytes: 256 << 20, Pids: 8, DiskBytes: 16 << 20, OpenFiles: 64, OutputBytes: 4 << 10},
}

// Config is what a node configures of the policy. Zero fields take the package's defaults.
type Config struct {
	// DefaultDiskBytes is the writable disk of a sandbox whose create names none;
	// MaxDiskBytes the most one sandbox may ask for.
	DefaultDiskBytes, MaxDiskBytes int64
	// DefaultTTL is the lifetime of a sandbox whose create names none; MaxTTL the longest
	// ttl, idle_ttl or auto_pause_after a create may ask for.
	DefaultTTL, MaxTTL time.Duration
}

func (c *Config) setDefaults() {
	if c.DefaultDiskBytes == 0 {
		c.DefaultDiskBytes = DefaultDiskBytes
	}
	if c.MaxDiskBytes == 0 {
		c.MaxDiskBytes = MaxDiskBytes
	}
	if c.DefaultTTL == 0 {
		c.DefaultTTL = DefaultTTL
	}
	if c.MaxTTL == 0 {
		c.MaxTTL = MaxTTL
	}
}

// Validate checks the configuration (after defaults), naming the flag at fault.
func (c Config) Validate() error {
	c.setDefaults()
	switch {
	case c.MaxDiskBytes > DiskCeiling:
		return errdefs.Invalid("max-sandbox-disk", "%d bytes is more than 1 PiB", c.MaxDiskBytes)
	case c.DefaultDiskBytes < minimums[TierContainer].DiskBytes || c.DefaultDiskBytes > c.MaxDiskBytes:
		return errdefs.Invalid("sandbox-disk", "%d bytes must be at least %s and at most --max-sandbox-disk (%d)",
			c.DefaultDiskBytes, Size(minimums[TierContainer].DiskBytes), c.MaxDiskBytes)
	case c.DefaultTTL < MinTTL || c.MaxTTL < MinTTL:
		return errdefs.Invalid("default-ttl", "TTLs must be at least %s", MinTTL)
	case c.DefaultTTL > c.MaxTTL:
		return errdefs.Invalid("default-ttl", "%s exceeds the maximum TTL %s", c.DefaultTTL, c.MaxTTL)
	}
	return nil
}

// Policy is the resolved table: every tier's bounds and the lifetimes. It is immutable.
type Policy struct {
	tiers              map[string]Bounds
	defaultTTL, maxTTL time.Duration
}

// New returns the policy of a node configured with c.
func New(c Config) (*Policy, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c.setDefaults()
	p := &Policy{tiers: map[string]Bounds{}, defaultTTL: c.DefaultTTL, maxTTL: c.MaxTTL}
	for _, tier := range Tiers {
		lo := minimums[tier]
		b := Bounds{
			Default: Limits{CPUs: DefaultCPUs, MemoryBytes: DefaultMemoryBytes, Pids: DefaultPids,
				DiskBytes: c.DefaultDiskBytes, OpenFiles: DefaultOpenFiles, OutputBytes: DefaultOutputBytes},
			Min: lo,
			Max: Limits{CPUs: MaxCPUs, MemoryBytes: MaxMemoryBytes, Pids: MaxPids,
				DiskBytes: c.MaxDiskBytes, OpenFiles: MaxOpenFiles, OutputBytes: MaxOutputBytes},
		}
		// A node whose default disk is below a tier's least (a microvm's 64 MiB) gives that
		// tier its least rather than refusing every create that names none.
		b.Default.DiskBytes = max(b.Default.DiskBytes, lo.DiskBytes)
		p.tiers[tier] = b
	}
	return p, nil
}

// Default is the policy of a node that configures nothing.
func Default() *Policy {
	p, err := New(Config{})
	if err != nil {
		panic(err) // the package's own constants are wrong
	}
	return p
}

// Bounds returns the bounds of tier; ok is false for a tier the table does not know.
func (p *Policy) Bounds(tier string) (b Bounds, ok bool) {
	b, ok = p.tiers[tier]
	return b, ok
}

// Resolve fills req's zero fields with tier's defaults and checks every field against its
// bounds. The error is errdefs.ErrInvalid naming the field; an unknown tier is an error of the
// caller (admission checks the tier first).
func (p *Policy) Resolve(tier string, req Limits) (Limits, error) {
	b, ok := p.tiers[tier]
	if !ok {
		return req, fmt.Errorf("resolve limits: tier %q is not in the limits table", tier)
	}
	out := req
	switch cpus := req.CPUs; {
	case math.IsNaN(cpus) || math.IsInf(cpus, 0) || cpus < 0 || cpus > b.Max.CPUs:
		return req, errdefs.Invalid("limits.cpus", "%g is outside [%g, %g] on %s", cpus, b.Min.CPUs, b.Max.CPUs, tier)
	case cpus == 0:
		out.CPUs = b.Default.CPUs
	case cpus < b.Min.CPUs:
		return req, errdefs.Invalid("limits.cpus", "at least %g on %s, got %g", b.Min.CPUs, tier, cpus)
	}
	for _, f := range fields(&out, &b) {
		v := *f.v
		switch {
		case v == 0:
			*f.v = f.def
		case v < 0 || v > f.max:
			return req, errdefs.Invalid(f.name, "%s is outside [%s, %s] on %s", f.show(v), f.show(f.min), f.show(f.max), tier)
		case v < f.min:
			return req, errdefs.Invalid(f.name, "at least %s on %s, got %s", f.show(f.min), tier, f.show(v))
		}
	}
	return out, nil
}

// field is one integer limit of a request and its bounds.
type field struct {
	name          string
	v             *int64
	def, min, max int64
	bytes         bool
}

func (f field) show(n int64) string {
	if f.bytes {
		return Size(n)
	}
	return fmt.Sprint(n)
}

func fields(l *Limits, b *Bounds) [5]field {
	return [5]field{
		{"limits.memory_bytes", &l.MemoryBytes, b.Default.MemoryBytes, b.Min.MemoryBytes, b.Max.MemoryBytes, true},
		{"limits.pids", &l.Pids, b.Default.Pids, b.Min.Pids, b.Max.Pids, false},
		{"limits.disk_bytes", &l.DiskBytes, b.Default.DiskBytes, b.Min.DiskBytes, b.Max.DiskBytes, true},
		{"limits.open_files", &l.OpenFiles, b.Default.OpenFiles, b.Min.OpenFiles, b.Max.OpenFiles, false},
		{"limits.output_bytes", &l.OutputBytes, b.Default.OutputBytes, b.Min.OutputBytes, b.Max.OutputBytes, true},
	}
}

// DefaultTTL is the lifetime of a sandbox whose create names none.
func (p *Policy) DefaultTTL() time.Duration { return p.defaultTTL }

// MaxTTL is the longest lifetime a create may ask for.
func (p *Policy) MaxTTL() time.Duration { return p.maxTTL }

// TTL parses a lifetime field of a create (ttl, idle_ttl, auto_pause_after: a Go duration) and
// checks it against [MinTTL, MaxTTL].
func (p *Policy) TTL(field, s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, errdefs.Invalid(field, "%q is not a duration (e.g. 30m, 2h)", s)
	}
	if d < MinTTL {
		return 0, errdefs.Invalid(field, "%s is shorter than the minimum %s", s, MinTTL)
	}
	if d > p.maxTTL {
		return 0, errdefs.Invalid(field, "%s exceeds the maximum %s", s, p.maxTTL)
	}
	return d, nil
}

// Size writes n bytes in binary units: whole units exactly (128 MiB), others with one decimal.
func Size(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; (m >= unit || m <= -unit) && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	if n%div == 0 {
		return fmt.Sprintf("%d %ciB", n/div, "KMGTPE"[exp])
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// Table renders the policy of a node that configures nothing as a Markdown table, one row per
// limit, its default (the same on every tier: TestResolveDefaults) and each tier's min–max, as
// docs/ARCHITECTURE.md shows it.
func Table() string {
	p := Default()
	var b strings.Builder
	b.WriteString("| limit | default |")
	for _, tier := range Tiers {
		b.WriteString(" " + tier + " |")
	}
	b.WriteString("\n|---|---|")
	for range Tiers {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	def, _ := p.Bounds(TierContainer)
	row := func(name, dflt string, bounds func(Bounds) string) {
		fmt.Fprintf(&b, "| `%s` | %s |", name, dflt)
		for _, tier := range Tiers {
			bt, _ := p.Bounds(tier)
			b.WriteString(" " + bounds(bt) + " |")
		}
		b.WriteString("\n")
	}
	row("limits.cpus", fmt.Sprint(def.Default.CPUs), func(bt Bounds) string { return fmt.Sprintf("%g–%g", bt.Min.CPUs, bt.Max.CPUs) })
	var probe Limits
	for i, f := range fields(&probe, &def) {
		row(f.name, f.show(f.def), func(bt Bounds) string {
			g := fields(&probe, &bt)[i]
			return g.show(g.min) + "–" + g.show(g.max)
		})
	}
	fmt.Fprintf(&b, "| `ttl`, `idle_ttl`, `auto_pause_after` | %s (`ttl`) | %s–%s | %s–%s | %s–%s | %s–%s |\n", p.DefaultTTL(),
		MinTTL, p.MaxTTL(), MinTTL, p.MaxTTL(), MinTTL, p.MaxTTL(), MinTTL, p.MaxTTL())
	return b.String()
}
