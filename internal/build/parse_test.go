package build

import (
	"archive/tar"
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/errdefs"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []string // Cmd|Args|JSON per instruction, meta args first
		err        string
	}{
		{name: "simple", text: "FROM base:1\nRUN echo hi\n", want: []string{"FROM|base:1|", "RUN|echo hi|"}},
		{name: "comments and blank lines", text: "# syntax=docker/dockerfile:1\n\n  # indented\nFROM a:1\n", want: []string{"FROM|a:1|"}},
		{name: "continuation", text: "FROM a:1\nRUN apt-get update && \\\n    apt-get install -y x \\\n  # a comment inside\n\n    && true\n",
			want: []string{"FROM|a:1|", "RUN|apt-get update && apt-get install -y x && true|"}},
		{name: "lower case", text: "from a:1\nrun true\n", want: []string{"FROM|a:1|", "RUN|true|"}},
		{name: "json form", text: `FROM a:1` + "\n" + `CMD ["sh", "-c", "echo $HOME"]` + "\n" + `ENTRYPOINT ["/bin/app"]`,
			want: []string{"FROM|a:1|", `CMD|["sh", "-c", "echo $HOME"]|sh,-c,echo $HOME`, `ENTRYPOINT|["/bin/app"]|/bin/app`}},
		{name: "not json is shell form", text: "FROM a:1\nRUN [ -f x ] || true\n", want: []string{"FROM|a:1|", "RUN|[ -f x ] || true|"}},
		{name: "arg before from", text: "ARG V=1\nFROM a:${V}\n", want: []string{"ARG|V=1|", "FROM|a:${V}|"}},
		{name: "flags", text: "FROM a:1\nCOPY --chown=app:app x /y\n", want: []string{"FROM|a:1|", "COPY|x /y|"}},
		{name: "tab after instruction", text: "FROM\ta:1\n", want: []string{"FROM|a:1|"}},
		{name: "crlf", text: "FROM a:1\r\nRUN true\r\n", want: []string{"FROM|a:1|", "RUN|true|"}},
		{name: "healthcheck", text: "FROM a:1\nHEALTHCHECK CMD true\n", err: "line 2: HEALTHCHECK is not supported"},
		{name: "onbuild", text: "FROM a:1\nONBUILD RUN x\n", err: "ONBUILD is not supported"},
		{name: "shell", text: "FROM a:1\nSHELL [\"bash\"]\n", err: "SHELL is not supported"},
		{name: "unknown", text: "FROM a:1\nFROBNICATE x\n", err: `unknown instruction "FROBNICATE"`},
		{name: "second from", text: "FROM a:1\nFROM b:1\n", err: "line 2: a second FROM"},
		{name: "run before from", text: "RUN true\nFROM a:1\n", err: "line 1: RUN before FROM"},
		{name: "empty", text: "# nothing\n", err: "no FROM"},
		{name: "heredoc", text: "FROM a:1\nRUN <<EOF\necho\nEOF\n", err: "heredocs"},
		{name: "empty run", text: "FROM a:1\nRUN\n", err: "RUN needs a command"},
		{name: "empty json run", text: "FROM a:1\nRUN []\n", err: "RUN needs a command"},
		{name: "nul", text: "FROM a:1\x00\n", err: "NUL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			df, err := Parse(tc.text)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errdefs.ErrInvalid) {
					t.Fatalf("Parse = %v, want an invalid error with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, in := range append(append([]Instruction(nil), df.MetaArgs...), df.Instructions...) {
				got = append(got, in.Cmd+"|"+in.Args+"|"+strings.Join(in.JSON, ","))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "a", "EMPTY": "", "PATH": "/bin"}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	for _, tc := range []struct{ in, want, err string }{
		{in: "$A", want: "a"},
		{in: "${A}b", want: "ab"},
		{in: "$Ab", want: ""},
		{in: "x-$A-y", want: "x-a-y"},
		{in: "${UNSET:-def}", want: "def"},
		{in: "${EMPTY:-def}", want: "def"},
		{in: "${EMPTY-def}", want: ""},
		{in: "${UNSET-def}", want: "def"},
		{in: "${A:+alt}", want: "alt"},
		{in: "${UNSET:+alt}", want: ""},
		{in: "${EMPTY+alt}", want: "alt"},
		{in: "${UNSET:-$A}", want: "a"},
		{in: `\$A`, want: "$A"},
		{in: "$", want: "$"},
		{in: "$1", want: "$1"},
		{in: "${PATH}:/usr/bin", want: "/bin:/usr/bin"},
		{in: "${A", err: "unterminated"},
		{in: "${A/x/y}", err: "unsupported modifier"},
		{in: "${}", err: "not a variable name"},
	} {
		got, err := Expand(tc.in, lookup)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Expand(%q) = %q, %v; want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Expand(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestKeyValues(t *testing.T) {
	lookup := func(k string) (string, bool) { return map[string]string{"X": "x"}[k], k == "X" }
	for _, tc := range []struct {
		in     string
		legacy bool
		want   string
	}{
		{in: "A=1 B=2", want: "A=1,B=2"},
		{in: `A="two words" B=$X`, want: "A=two words,B=x"},
		{in: `A=one\ two`, want: "A=one two"},
		{in: "A the rest of it", legacy: true, want: "A=the rest of it"},
		{in: "A $X", legacy: true, want: "A=x"},
	} {
		kvs, err := KeyValues(tc.in, tc.legacy, lookup)
		if err != nil {
			t.Errorf("KeyValues(%q): %v", tc.in, err)
			continue
		}
		var got []string
		for _, kv := range kvs {
			got = append(got, kv[0]+"="+kv[1])
		}
		if strings.Join(got, ",") != tc.want {
			t.Errorf("KeyValues(%q) = %q, want %q", tc.in, strings.Join(got, ","), tc.want)
		}
	}
	for _, bad := range []string{"A", `A="open`, "=v"} {
		if _, err := KeyValues(bad, false, lookup); err == nil {
			t.Errorf("KeyValues(%q) accepted", bad)
		}
	}
}

func TestIgnore(t *testing.T) {
	ig, err := ParseIgnore("# comment\n*.key\n/build\ndocs/**/*.md\n!docs/keep.md\n**/tmp\n")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"a.key": true, "dir/a.key": false, "build": true, "build/x/y": true, "builder": false,
		"docs/a.md": true, "docs/x/y/b.md": true, "docs/keep.md": false, "docs/a.txt": false,
		"tmp": true, "x/tmp/f": true, "src/main.go": false,
	} {
		if got := ig.Excludes(name); got != want {
			t.Errorf("Excludes(%q) = %v, want %v", name, got, want)
		}
	}
}

// contextOf makes a context from name -> content ("/" suffix: a directory, "->x": a link).
func contextOf(t *testing.T, files map[string]string) *Context {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, content := range files {
		h := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}
		switch {
		case strings.HasSuffix(name, "/"):
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		case strings.HasPrefix(content, "->"):
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, content[2:], 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(content))
		}
	}
	tw.Close()
	c, err := ReadContext(&buf, t.TempDir(), 1<<20, 100)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestReadContextRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		hdr  tar.Header
		err  string
	}{
		{"escape", tar.Header{Name: "../x", Typeflag: tar.TypeReg}, "leaves the context"},
		{"absolute", tar.Header{Name: "/etc/passwd", Typeflag: tar.TypeReg}, "absolute"},
		{"device", tar.Header{Name: "dev", Typeflag: tar.TypeChar}, "device node"},
		{"hard link", tar.Header{Name: "l", Typeflag: tar.TypeLink, Linkname: "x"}, "hard link"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tw := tar.NewWriter(&buf)
			h := tc.hdr
			if err := tw.WriteHeader(&h); err != nil {
				t.Fatal(err)
			}
			tw.Close()
			_, err := ReadContext(&buf, t.TempDir(), 1<<20, 100)
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("ReadContext = %v, want %q", err, tc.err)
			}
		})
	}
	t.Run("too many entries", func(t *testing.T) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for i := 0; i < 5; i++ {
			tw.WriteHeader(&tar.Header{Name: strings.Repeat("x", i+1), Typeflag: tar.TypeReg})
		}
		tw.Close()
		if _, err := ReadContext(&buf, t.TempDir(), 1<<20, 4); !errors.Is(err, errdefs.ErrTooLarge) {
			t.Fatalf("ReadContext = %v, want too large", err)
		}
	})
	t.Run("too large", func(t *testing.T) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Size: 1 << 16})
		tw.Write(make([]byte, 1<<16))
		tw.Close()
		if _, err := ReadContext(&buf, t.TempDir(), 1<<12, 100); !errors.Is(err, errdefs.ErrTooLarge) {
			t.Fatalf("ReadContext = %v, want too large", err)
		}
	})
}

func TestPlan(t *testing.T) {
	bctx := contextOf(t, map[string]string{
		"app/": "", "app/a.txt": "A", "app/sub/b.txt": "B", "top.txt": "T", "link": "->app/a.txt",
		"x.key": "K", ".dockerignore": "*.key\n",
	})
	df, err := Parse(`ARG BASE=base:1
FROM $BASE
ARG WHO=world
ENV GREETING="hello ${WHO}" PATH=/opt/bin:$PATH
WORKDIR /srv
WORKDIR app
COPY app/ dest/
COPY top.txt link ./
COPY --chown=1000:1000 --chmod=600 top.txt /etc/top.conf
RUN echo $GREETING
USER nobody
ENTRYPOINT ["/bin/app"]
LABEL a=b
EXPOSE 80
`)
	if err != nil {
		t.Fatal(err)
	}
	base := &ImageConfig{Env: []string{"PATH=/bin"}, Cmd: []string{"sh"}}
	p, err := MakePlan(df, map[string]string{"WHO": "corral", "UNUSED": "x"}, base, bctx)
	if err != nil {
		t.Fatal(err)
	}
	if p.From != "base:1" {
		t.Errorf("From = %q", p.From)
	}
	if p.Layers() != 4 {
		t.Errorf("Layers = %d, want 4", p.Layers())
	}
	copy1, copy2, copy3, run := p.Steps[5], p.Steps[6], p.Steps[7], p.Steps[8]
	var rels []string
	for _, f := range copy1.Files {
		rels = append(rels, f.Rel)
	}
	if copy1.DestDir != "/srv/app/dest" || strings.Join(rels, ",") != "a.txt,sub/b.txt" {
		t.Errorf("COPY app/ dest/ = %s %v", copy1.DestDir, rels)
	}
	if copy2.DestDir != "/srv/app" || len(copy2.Files) != 2 || copy2.Files[0].Rel != "top.txt" || copy2.Files[1].Rel != "link" {
		t.Errorf("COPY top.txt link ./ = %s %+v", copy2.DestDir, copy2.Files)
	}
	if copy3.DestDir != "/etc" || copy3.Files[0].Rel != "top.conf" || copy3.Chown != "1000:1000" || copy3.Chmod != 0o600 {
		t.Errorf("COPY --chown to a file = %+v", copy3)
	}
	if !slices.Equal(run.Argv, []string{"/bin/sh", "-c", "echo $GREETING"}) || run.Cwd != "/srv/app" ||
		!slices.Contains(run.Env, "WHO=corral") || !slices.Contains(run.Env, "GREETING=hello corral") || !slices.Contains(run.Env, "PATH=/opt/bin:/bin") {
		t.Errorf("RUN = %+v", run)
	}
	c := p.Config
	if c.User != "nobody" || c.WorkingDir != "/srv/app" || c.Cmd != nil || !slices.Equal(c.Entrypoint, []string{"/bin/app"}) || c.Labels["a"] != "b" {
		t.Errorf("config = %+v", c)
	}
	if slices.Contains(c.Env, "WHO=corral") {
		t.Errorf("an ARG reached the environment's configuration: %v", c.Env)
	}
	if len(p.Warnings) != 2 {
		t.Errorf("warnings = %q, want EXPOSE and UNUSED", p.Warnings)
	}
	// The cache key of a step changes with what it copies.
	bctx2 := contextOf(t, map[string]string{"app/": "", "app/a.txt": "changed", "app/sub/b.txt": "B", "top.txt": "T", "link": "->app/a.txt"})
	p2, err := MakePlan(df, map[string]string{"WHO": "corral"}, base, bctx2)
	if err != nil {
		t.Fatal(err)
	}
	if p2.Steps[5].Inputs == copy1.Inputs || p2.Steps[6].Inputs != copy2.Inputs || p2.Steps[8].Inputs != run.Inputs {
		t.Errorf("inputs: a changed file must change its COPY's key only")
	}

	for _, tc := range []struct{ text, err string }{
		{"FROM a:1\nCOPY ../x /y\n", "outside the build context"},
		{"FROM a:1\nCOPY app/../../x /y\n", "outside the build context"},
		{"FROM a:1\nCOPY x.key /y\n", "not in the build context"},
		{"FROM a:1\nCOPY *.nothing /y/\n", "matches nothing"},
		{"FROM a:1\nCOPY --from=build /x /y\n", "multi-stage"},
		{"FROM a:1\nADD https://example.com/x /y\n", "remote sources"},
		{"FROM a:1\nADD top.tar.gz /y\n", "unpacking archives"},
		{"FROM a:1\nRUN --mount=type=cache,target=/x true\n", "is not supported"},
		{"FROM a:1\nUSER bad user\n", "not a user name"},
		{"FROM a:1 AS b\n", "multi-stage"},
		{"FROM --platform=linux/arm64 a:1\n", "no flags"},
		{"FROM scratch\n", "scratch"},
		{"FROM a:1\nCOPY onlyone\n", "a source and a destination"},
	} {
		df, err := Parse(tc.text)
		if err == nil {
			_, err = MakePlan(df, nil, nil, bctx)
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%q: %v, want invalid %q", tc.text, err, tc.err)
		}
	}
}

func TestWriteCopyTar(t *testing.T) {
	bctx := contextOf(t, map[string]string{"d/": "", "d/f": "content", "d/l": "->f"})
	df, _ := Parse("FROM a:1\nCOPY --chown=5:5 d /dst\n")
	p, err := MakePlan(df, nil, nil, bctx)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteCopyTar(bctx, p.Steps[1], tar.NewWriter(&buf)); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(&buf)
	var got []string
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		var b bytes.Buffer
		b.ReadFrom(tr)
		got = append(got, h.Name+"="+b.String()+h.Linkname)
	}
	if strings.Join(got, " ") != "f=content l=f" {
		t.Errorf("copy tar = %q", got)
	}
}

func FuzzParse(f *testing.F) {
	f.Add("FROM a:1\nRUN echo hi \\\n  there\nCOPY --chown=a:b x y\nENV A=1 B=\"2 3\"\nCMD [\"a\"]\n")
	f.Add("ARG X=1\nFROM ${X:-y}\nLABEL a=b\n")
	f.Add("FROM a\nRUN <<EOF\nx\nEOF\n")
	f.Fuzz(func(t *testing.T, text string) {
		df, err := Parse(text)
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("Parse error of the wrong kind: %v", err)
			}
			return
		}
		if len(df.Instructions) == 0 || df.Instructions[0].Cmd != "FROM" {
			t.Fatalf("parsed without FROM first: %+v", df)
		}
		p, err := MakePlan(df, map[string]string{"X": "1"}, nil, EmptyContext())
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("MakePlan error of the wrong kind: %v", err)
			}
			return
		}
		for _, s := range p.Steps {
			if s.Kind == StepRun && len(s.Argv) == 0 {
				t.Fatalf("a RUN step without a command: %+v", s)
			}
		}
	})
}

func FuzzExpand(f *testing.F) {
	f.Add("${A:-${B:+x}}$C\\$D")
	f.Fuzz(func(t *testing.T, s string) {
		Expand(s, func(k string) (string, bool) { return k, len(k)%2 == 0 })
	})
}

func FuzzReadContext(f *testing.F) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: ".dockerignore", Typeflag: tar.TypeReg, Size: 6, Mode: 0o644})
	tw.Write([]byte("*.key\n"))
	tw.WriteHeader(&tar.Header{Name: "a/b", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644})
	tw.Write([]byte("x"))
	tw.WriteHeader(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../../etc"})
	tw.Close()
	f.Add(buf.Bytes(), "a")
	f.Fuzz(func(t *testing.T, data []byte, src string) {
		c, err := ReadContext(bytes.NewReader(data), t.TempDir(), 1<<20, 1000)
		if err != nil {
			return
		}
		defer c.Close()
		files, _, err := c.Select(src)
		if err != nil {
			return
		}
		for _, f := range files {
			if strings.HasPrefix(f.Entry.Name, "/") || slices.Contains(strings.Split(f.Entry.Name, "/"), "..") ||
				slices.Contains(strings.Split(f.Rel, "/"), "..") || strings.HasPrefix(f.Rel, "/") {
				t.Fatalf("Select(%q) gave %q -> %q", src, f.Entry.Name, f.Rel)
			}
		}
	})
}

func TestDocComments(t *testing.T) { doccheck.Exported(t, ".") }
