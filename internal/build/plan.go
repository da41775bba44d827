package build

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazyregexp"
)

// Step kinds.
const (
	StepConfig = "config" // changes the configuration only (ENV, WORKDIR, ...): no layer
	StepRun    = "run"    // runs a command in a sandbox: a layer of what it changed
	StepCopy   = "copy"   // copies files of the context: a layer of what it wrote
)

// Step is one planned instruction.
type Step struct {
	N    int    // from 1; the FROM is step 1
	Text string // the instruction as written, for progress lines
	Kind string
	// RUN: the command and the configuration it runs with.
	Argv []string
	Env  []string
	Cwd  string
	User string
	// COPY/ADD: where the files go, owned by Chown (empty: root), with Chmod (0: as in the
	// context).
	DestDir string
	Files   []CopyFile
	Chown   string
	Chmod   int64
	// Inputs is the canonical form of everything the step's result depends on, besides the
	// layers below it: the cache key is sha256(parent key, Inputs).
	Inputs string
}

// CopyFile is one context entry a COPY writes, at Rel below the step's DestDir.
type CopyFile struct {
	Entry *Entry
	Rel   string
}

// Plan is a checked build: the FROM reference, the steps and the configuration the result
// records.
type Plan struct {
	From     string
	Steps    []Step
	Config   ImageConfig
	Warnings []string
}

// Layers counts the steps that make a layer.
func (p *Plan) Layers() int {
	n := 0
	for _, s := range p.Steps {
		if s.Kind != StepConfig {
			n++
		}
	}
	return n
}

var argNameRE = lazyregexp.New(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidateArgs checks build arguments (KEY=VALUE) and returns them as a map.
func ValidateArgs(args []string) (map[string]string, error) {
	if len(args) > 256 {
		return nil, errdefs.Invalid("build_args", "at most 256, got %d", len(args))
	}
	out := map[string]string{}
	for i, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok || !argNameRE.MatchString(k) {
			return nil, errdefs.Invalid(fmt.Sprintf("build_args[%d]", i), "%q is not NAME=VALUE", a)
		}
		if strings.IndexByte(v, 0) >= 0 || len(v) > 64<<10 {
			return nil, errdefs.Invalid(fmt.Sprintf("build_args[%d]", i), "value of %s contains NUL or is longer than 64 KiB", k)
		}
		out[k] = v
	}
	return out, nil
}

// FromRef returns the FROM reference of df, ARGs before it expanded.
func FromRef(df *Dockerfile, args map[string]string) (string, error) {
	meta, err := metaArgs(df, args)
	if err != nil {
		return "", err
	}
	from := df.Instructions[0]
	if len(from.Flags) > 0 {
		return "", lineErr(from.Line, "FROM %s is not supported (no flags)", from.Flags[0])
	}
	words, err := Words(from.Args)
	if err != nil {
		return "", lineErr(from.Line, "%v", err)
	}
	if len(words) == 3 && strings.EqualFold(words[1], "AS") {
		return "", lineErr(from.Line, "FROM ... AS %s: multi-stage builds are not supported; build one stage per environment", words[2])
	}
	if len(words) != 1 {
		return "", lineErr(from.Line, "FROM takes one reference, got %q", from.Args)
	}
	ref, err := Expand(words[0], lookupIn(meta))
	if err != nil {
		return "", lineErr(from.Line, "%v", err)
	}
	if ref == "" {
		return "", lineErr(from.Line, "FROM %s expands to nothing", words[0])
	}
	if ref == "scratch" {
		return "", lineErr(from.Line, "FROM scratch is not supported: a Corral environment starts from a layer or an environment")
	}
	return ref, nil
}

func metaArgs(df *Dockerfile, args map[string]string) (map[string]string, error) {
	meta := map[string]string{}
	for _, in := range df.MetaArgs {
		k, v, err := parseArg(in, lookupIn(meta))
		if err != nil {
			return nil, err
		}
		if given, ok := args[k]; ok {
			v = given
		}
		meta[k] = v
	}
	return meta, nil
}

func parseArg(in Instruction, lookup func(string) (string, bool)) (string, string, error) {
	if len(in.Flags) > 0 {
		return "", "", lineErr(in.Line, "ARG takes no flags")
	}
	words, err := Words(in.Args)
	if err != nil || len(words) != 1 {
		return "", "", lineErr(in.Line, "ARG takes one NAME or NAME=DEFAULT, got %q", in.Args)
	}
	k, v, _ := strings.Cut(words[0], "=")
	if !argNameRE.MatchString(k) {
		return "", "", lineErr(in.Line, "%q is not an argument name", k)
	}
	v, err = Expand(v, lookup)
	if err != nil {
		return "", "", lineErr(in.Line, "%v", err)
	}
	return k, v, nil
}

func lookupIn(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// MakePlan checks df against the base configuration of its FROM and the context, and plans
// its steps. Every error is ErrInvalid naming the line: nothing has been made yet.
func MakePlan(df *Dockerfile, args map[string]string, base *ImageConfig, bctx *Context) (*Plan, error) {
	from, err := FromRef(df, args)
	if err != nil {
		return nil, err
	}
	meta, _ := metaArgs(df, args)
	p := &Plan{From: from}
	cfg := ImageConfig{}
	if base != nil {
		cfg = *base
		cfg.Env = slices.Clone(base.Env)
		cfg.Labels = maps.Clone(base.Labels)
	}
	env := map[string]string{}
	var envOrder []string
	for _, kv := range cfg.Env {
		k, v, _ := strings.Cut(kv, "=")
		if _, ok := env[k]; !ok {
			envOrder = append(envOrder, k)
		}
		env[k] = v
	}
	declared := map[string]string{} // ARGs in scope after FROM
	used := map[string]bool{}
	for k := range meta {
		used[k] = true
	}
	lookup := func(k string) (string, bool) {
		if v, ok := env[k]; ok {
			return v, true
		}
		v, ok := declared[k]
		return v, ok
	}
	cmdHere := false
	p.Steps = append(p.Steps, Step{N: 1, Text: df.Instructions[0].String(), Kind: StepConfig})
	for i, in := range df.Instructions[1:] {
		st := Step{N: i + 2, Text: in.String(), Kind: StepConfig}
		expand := func(s string) (string, error) {
			v, err := Expand(s, lookup)
			if err != nil {
				return "", lineErr(in.Line, "%v", err)
			}
			return v, nil
		}
		switch in.Cmd {
		case "ARG":
			k, v, err := parseArg(in, lookup)
			if err != nil {
				return nil, err
			}
			if !strings.Contains(in.Args, "=") {
				v = meta[k] // a redeclared global ARG takes its value
			}
			if given, ok := args[k]; ok {
				v = given
			}
			declared[k], used[k] = v, true
		case "ENV":
			if len(in.Flags) > 0 {
				return nil, lineErr(in.Line, "ENV takes no flags")
			}
			kvs, err := KeyValues(in.Args, true, lookup)
			if err != nil {
				return nil, lineErr(in.Line, "ENV: %v", err)
			}
			for _, kv := range kvs {
				if !validName(kv[0]) {
					return nil, lineErr(in.Line, "ENV: %q is not a variable name", kv[0])
				}
				if _, ok := env[kv[0]]; !ok {
					envOrder = append(envOrder, kv[0])
				}
				env[kv[0]] = kv[1]
			}
		case "LABEL":
			if len(in.Flags) > 0 {
				return nil, lineErr(in.Line, "LABEL takes no flags")
			}
			kvs, err := KeyValues(in.Args, false, lookup)
			if err != nil {
				return nil, lineErr(in.Line, "LABEL: %v", err)
			}
			if cfg.Labels == nil {
				cfg.Labels = map[string]string{}
			}
			for _, kv := range kvs {
				cfg.Labels[kv[0]] = kv[1]
			}
		case "WORKDIR":
			if len(in.Flags) > 0 {
				return nil, lineErr(in.Line, "WORKDIR takes no flags")
			}
			d, err := expand(in.Args)
			if err != nil {
				return nil, err
			}
			cfg.WorkingDir = path.Join(cwdOf(cfg), d)
			if path.IsAbs(d) {
				cfg.WorkingDir = path.Clean(d)
			}
		case "USER":
			if len(in.Flags) > 0 {
				return nil, lineErr(in.Line, "USER takes no flags")
			}
			u, err := expand(in.Args)
			if err != nil {
				return nil, err
			}
			if !userRE.MatchString(u) {
				return nil, lineErr(in.Line, "USER %q is not a user name or uid[:gid]", u)
			}
			cfg.User = u
		case "EXPOSE":
			p.Warnings = append(p.Warnings, fmt.Sprintf("line %d: EXPOSE is recorded nowhere: a sandbox's ports are reached with corral port", in.Line))
		case "CMD", "ENTRYPOINT":
			if len(in.Flags) > 0 {
				return nil, lineErr(in.Line, "%s takes no flags", in.Cmd)
			}
			argv := in.JSON
			if argv == nil {
				argv = []string{"/bin/sh", "-c", in.Args}
			}
			if in.Cmd == "CMD" {
				cfg.Cmd, cmdHere = argv, true
			} else {
				cfg.Entrypoint = argv
				if !cmdHere {
					cfg.Cmd = nil // as Docker: an ENTRYPOINT resets the CMD of the base image
				}
			}
		case "RUN":
			if len(in.Flags) > 0 {
				return nil, lineErr(in.Line, "RUN %s is not supported (the build's network policy is set with --net-allow)", in.Flags[0])
			}
			st.Kind = StepRun
			st.Argv = in.JSON
			if st.Argv == nil {
				st.Argv = []string{"/bin/sh", "-c", in.Args}
			}
			st.Cwd, st.User = cwdOf(cfg), cfg.User
			// ARGs in scope reach the command's environment (ENV wins), as in Docker.
			for _, k := range sortedKeys(declared) {
				if _, ok := env[k]; !ok {
					st.Env = append(st.Env, k+"="+declared[k])
				}
			}
			for _, k := range envOrder {
				st.Env = append(st.Env, k+"="+env[k])
			}
			b, _ := json.Marshal(map[string]any{"op": "run", "argv": st.Argv, "env": st.Env, "cwd": st.Cwd, "user": st.User})
			st.Inputs = string(b)
		case "COPY", "ADD":
			if err := planCopy(&st, in, bctx, cfg, expand); err != nil {
				return nil, err
			}
		}
		p.Steps = append(p.Steps, st)
	}
	for _, k := range sortedKeys(args) {
		if !used[k] {
			p.Warnings = append(p.Warnings, fmt.Sprintf("build argument %s was not consumed by any ARG", k))
		}
	}
	cfg.Env = nil
	for _, k := range envOrder {
		cfg.Env = append(cfg.Env, k+"="+env[k])
	}
	p.Config = cfg
	return p, nil
}

// userRE is the edge's rule for a user name or uid[:gid].
var userRE = lazyregexp.New(`^([a-z_][a-z0-9_.-]{0,31}|[0-9]{1,10}(:[0-9]{1,10})?)$`)

func cwdOf(cfg ImageConfig) string {
	if cfg.WorkingDir == "" {
		return "/"
	}
	return cfg.WorkingDir
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

var archiveSuffixes = []string{".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst"}

func planCopy(st *Step, in Instruction, bctx *Context, cfg ImageConfig, expand func(string) (string, error)) error {
	st.Kind = StepCopy
	for _, f := range in.Flags {
		name, val, _ := strings.Cut(f, "=")
		switch name {
		case "--chown":
			v, err := expand(val)
			if err != nil {
				return err
			}
			if !userRE.MatchString(v) {
				return lineErr(in.Line, "%s --chown=%q is not a user name or uid[:gid]", in.Cmd, v)
			}
			st.Chown = v
		case "--chmod":
			m, err := strconv.ParseInt(val, 8, 32)
			if err != nil || m < 0 || m > 0o7777 {
				return lineErr(in.Line, "%s --chmod=%q is not an octal mode", in.Cmd, val)
			}
			st.Chmod = m
		case "--from":
			return lineErr(in.Line, "%s --from: multi-stage builds are not supported", in.Cmd)
		default:
			return lineErr(in.Line, "%s %s is not supported (supported: --chown, --chmod)", in.Cmd, name)
		}
	}
	var words []string
	if strings.HasPrefix(in.Args, "[") {
		if err := json.Unmarshal([]byte(in.Args), &words); err != nil {
			return lineErr(in.Line, "%s: malformed JSON form: %v", in.Cmd, err)
		}
	} else {
		var err error
		if words, err = Words(in.Args); err != nil {
			return lineErr(in.Line, "%s: %v", in.Cmd, err)
		}
	}
	if len(words) < 2 {
		return lineErr(in.Line, "%s needs a source and a destination", in.Cmd)
	}
	for i := range words {
		v, err := expand(words[i])
		if err != nil {
			return err
		}
		words[i] = v
	}
	srcs, dest := words[:len(words)-1], words[len(words)-1]
	destDir := strings.HasSuffix(dest, "/") || len(srcs) > 1
	if !path.IsAbs(dest) {
		dest = path.Join(cwdOf(cfg), dest)
	}
	dest = path.Clean(dest)
	if bctx == nil {
		bctx = EmptyContext()
	}
	type sel struct {
		files []Copied
		dir   bool
	}
	var sels []sel
	for _, src := range srcs {
		if in.Cmd == "ADD" {
			if strings.Contains(src, "://") || strings.HasPrefix(src, "git@") {
				return lineErr(in.Line, "ADD %s: remote sources are not supported; download in a RUN step (with --net-allow)", src)
			}
			for _, suf := range archiveSuffixes {
				if strings.HasSuffix(src, suf) {
					return lineErr(in.Line, "ADD %s: unpacking archives is not supported; COPY it and unpack it in a RUN step", src)
				}
			}
		}
		files, dir, err := bctx.Select(src)
		if err != nil {
			return lineErr(in.Line, "%v", err)
		}
		if dir || strings.ContainsAny(src, "*?[") {
			destDir = true
		}
		sels = append(sels, sel{files, dir})
	}
	st.DestDir = dest
	for _, s := range sels {
		for _, f := range s.files {
			rel := f.Rel
			if rel == "" {
				if destDir {
					rel = path.Base(f.Entry.Name)
				} else {
					st.DestDir, rel = path.Dir(dest), path.Base(dest)
				}
			}
			st.Files = append(st.Files, CopyFile{Entry: f.Entry, Rel: rel})
		}
	}
	if st.DestDir == "/" && !destDir && len(st.Files) == 1 && st.Files[0].Rel == "" {
		return lineErr(in.Line, "%s: the destination / is not a file name", in.Cmd)
	}
	h := sha256.New()
	fmt.Fprintf(h, "op=copy\x00dest=%s\x00chown=%s\x00chmod=%o\x00", st.DestDir, st.Chown, st.Chmod)
	for _, f := range st.Files {
		e := f.Entry
		fmt.Fprintf(h, "%s\x00%c\x00%o\x00%s\x00%s\x00", f.Rel, e.Hdr.Typeflag, e.Hdr.Mode&0o7777, e.Hdr.Linkname, e.Sum)
	}
	st.Inputs = "copy:" + hex.EncodeToString(h.Sum(nil))
	return nil
}

// WriteCopyTar writes the tar a COPY step extracts into its destination directory.
func WriteCopyTar(bctx *Context, st Step, tw *tar.Writer) error {
	for _, f := range st.Files {
		h := f.Entry.Hdr
		h.Name = f.Rel
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		h.PAXRecords, h.Xattrs = nil, nil //nolint:staticcheck // drop what the context carried
		h.Format = tar.FormatPAX
		if st.Chmod != 0 {
			h.Mode = st.Chmod
		}
		if err := tw.WriteHeader(&h); err != nil {
			return fmt.Errorf("write %s: %w", h.Name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.CopyN(tw, bctx.Open(f.Entry), h.Size); err != nil {
				return fmt.Errorf("write %s: %w", h.Name, err)
			}
		}
	}
	return tw.Close()
}

// Key returns the cache key of a step whose layers below have key parent.
func Key(parent, inputs string) string {
	h := sha256.Sum256([]byte(parent + "\x00" + inputs))
	return hex.EncodeToString(h[:])
}
