//go:build !lean

package cli

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/build"
	"github.com/corral-dev/corral/internal/oci"
	corral "github.com/corral-dev/corral/sdk/go"
)

func (a *app) newEnvBuildCmd() *cobra.Command {
	var file, contextDir, runtime, project string
	var buildArgs []string
	var noCache, detach bool
	var net netFlags
	cmd := &cobra.Command{
		Use:   "build NAME [--file Dockerfile] [--context DIR] [--build-arg K=V]... [--net-allow RULE]... [--runtime runc|gvisor]",
		Short: "Build an environment from a Dockerfile",
		Long: `Build the environment NAME from a Dockerfile. Each RUN runs in a sandbox of the build's network
policy (default: no network; --net-allow opens it), each COPY/ADD copies from the context directory
(.dockerignore honoured), and each step's result is a layer keyed by the layers below it and the
step's inputs: a rebuild runs only the steps after the first change ("CACHED" otherwise).

FROM names a layer NAME:VERSION, a saved environment, or a local image archive
(docker-archive:FILE, oci-archive:FILE[:TAG], oci-layout:DIR[:TAG]), which the CLI imports first.
Supported: FROM, RUN, COPY, ADD (local files only), ENV, WORKDIR, USER, ARG, LABEL, CMD,
ENTRYPOINT, EXPOSE (ignored). Multi-stage builds, HEALTHCHECK, ONBUILD, SHELL, VOLUME and
heredocs are refused before anything is made.`,
		Example: `  corral env build app --file Dockerfile --context .
  corral env build app -f Dockerfile --build-arg VERSION=1.2 --net-allow pypi --net-allow '*.pythonhosted.org'
  corral create --env app`,
		Args: exactArgs(1, "an environment NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if file == "" {
				file = defaultDockerfile(contextDir)
				if _, err := os.Stat(file); err != nil {
					return usagef("no --file, and no %s to default to", file)
				}
			}
			text, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			policy, err := net.policy()
			if err != nil {
				return err
			}
			if runtime == "runsc" {
				runtime = "gvisor"
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			req := corral.BuildRequest{Name: args[0], Dockerfile: string(text), BuildArgs: buildArgs, Network: policy,
				Runtime: runtime, Project: project, NoCache: noCache}
			if req.From, err = a.importFrom(ctx, c, req); err != nil {
				return err
			}
			var ctxTar io.Reader
			if contextDir != "" {
				if fi, err := os.Stat(contextDir); err != nil {
					return err
				} else if !fi.IsDir() {
					return usagef("--context %s is not a directory", contextDir)
				}
				pr, pw := io.Pipe()
				go func() { pw.CloseWithError(contextTar(contextDir, pw)) }()
				defer pr.Close()
				ctxTar = pr
			}
			b, err := c.StartBuild(ctx, req, ctxTar)
			if err != nil {
				return err
			}
			if detach {
				if a.jsonOut() {
					return a.printJSON(b)
				}
				_, err := fmt.Fprintln(a.stdout, b.ID)
				return err
			}
			return a.followBuild(ctx, c, b.ID)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "file", "f", "", "the Dockerfile (default: Dockerfile in the context directory, or in this one)")
	f.StringVar(&contextDir, "context", "", "the build context directory COPY and ADD read from (default: none)")
	f.StringArrayVar(&buildArgs, "build-arg", nil, "a value of an ARG, NAME=VALUE (repeatable)")
	f.StringVar(&runtime, "runtime", "", "runtime of the RUN steps' sandboxes: runc (default) or gvisor (runsc)")
	f.StringVar(&project, "project", "", "project that owns the environment and its layers (default: the token's)")
	f.BoolVar(&noCache, "no-cache", false, "run every step again")
	f.BoolVarP(&detach, "detach", "d", false, "print the build's ID and return (follow with GET /v1/builds/ID/logs)")
	net.add(f)
	return cmd
}

// followBuild prints a build's progress and output until it ends; a failed build is an error.
func (a *app) followBuild(ctx context.Context, c *corral.Client, id string) error {
	logs, err := c.BuildLogs(ctx, id, true)
	if err != nil {
		return err
	}
	defer logs.Close()
	// Interrupted (Ctrl-C), the CLI cancels the build it started, as docker build does.
	stop := context.AfterFunc(ctx, func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if _, err := c.CancelBuild(cctx, id); err == nil {
			fmt.Fprintf(a.stderr, "build %s cancelled\n", id)
		}
		logs.Close()
	})
	defer stop()
	for {
		ev, err := logs.Next()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("build %s: the log ended before the build did (its state: GET /v1/builds/%s)", id, id)
		}
		if err != nil {
			return err
		}
		switch ev.Type {
		case "step":
			if !a.jsonOut() {
				fmt.Fprintln(a.stderr, ev.Text)
			}
		case "log":
			if !a.jsonOut() {
				a.stderr.Write(ev.Data)
			}
		case "end":
			b := ev.Build
			if a.jsonOut() {
				if err := a.printJSON(b); err != nil {
					return err
				}
			}
			if b.State != corral.BuildSucceeded {
				return fmt.Errorf("build %s failed: %s", b.ID, b.Error)
			}
			if !a.jsonOut() {
				fmt.Fprintf(a.stdout, "%s (%s)\n", b.Name, b.Layer)
			}
			return nil
		}
	}
}

// archivePrefixes are FROM references the CLI imports itself before the build.
var archivePrefixes = []string{"docker-archive:", "oci-archive:", "oci-layout:"}

// importFrom imports a local image archive named by the Dockerfile's FROM as a layer, once
// per archive content, and returns its reference ("" when FROM names no archive).
func (a *app) importFrom(ctx context.Context, c *corral.Client, req corral.BuildRequest) (string, error) {
	df, err := build.Parse(req.Dockerfile)
	if err != nil {
		return "", nil // the server answers with the error
	}
	args, err := build.ValidateArgs(req.BuildArgs)
	if err != nil {
		return "", nil
	}
	ref, err := build.FromRef(df, args)
	if err != nil {
		return "", nil
	}
	var kind string
	for _, p := range archivePrefixes {
		if strings.HasPrefix(ref, p) {
			kind = p
		}
	}
	if kind == "" {
		return "", nil
	}
	target := strings.TrimPrefix(ref, kind)
	file, tag := target, ""
	if kind != "docker-archive:" {
		file, tag, _ = strings.Cut(target, ":")
	}
	sum, err := hashPath(file)
	if err != nil {
		return "", fmt.Errorf("FROM %s: %w", ref, err)
	}
	name, version := "corral.build.image", sum[:40]
	if tag != "" {
		version = sum[:24] + "-" + strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
				return r
			}
			return '_'
		}, tag)
	}
	if _, err := c.Layer(ctx, name, version); err == nil {
		return name + ":" + version, nil
	}
	src := oci.Source{}
	switch kind {
	case "docker-archive:":
		src.DockerArchive = file
	case "oci-layout:":
		src.Layout = target
	case "oci-archive:":
		dir, err := extractOCIArchive(file)
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(dir)
		src.Layout = dir
		if tag != "" {
			src.Layout += ":" + tag
		}
	}
	fmt.Fprintf(a.stderr, "importing %s as %s:%s\n", ref, name, version)
	l, err := a.importImage(ctx, c, name, version, corral.KindBase, src, oci.Options{}, -1, corral.ImportOptions{Project: req.Project})
	if err != nil {
		return "", fmt.Errorf("FROM %s: %w", ref, err)
	}
	return l.Name + ":" + l.Version, nil
}

// hashPath is the sha256 of a file, or of a directory's files (names and contents).
func hashPath(p string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fmt.Fprintf(h, "%s\x00", path[len(p):])
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(h, f)
		return err
	})
	return hex.EncodeToString(h.Sum(nil)), err
}

// defaultDockerfile is the Dockerfile a build without --file reads: the context directory's,
// or this directory's when the build has no context.
func defaultDockerfile(contextDir string) string {
	if contextDir == "" {
		return "Dockerfile"
	}
	return filepath.Join(contextDir, "Dockerfile")
}

// contextTar writes dir as a build context: files, directories and symbolic links (never
// followed), owners and times left out, what .dockerignore excludes left out too (the server
// applies it again).
func contextTar(dir string, w io.Writer) error {
	var ig *build.Ignore
	if b, err := os.ReadFile(filepath.Join(dir, ".dockerignore")); err == nil {
		if ig, err = build.ParseIgnore(string(b)); err != nil {
			return err
		}
	}
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if ig.Excludes(rel) && rel != ".dockerignore" {
			if d.IsDir() && !ig.MayReinclude() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		switch {
		case fi.Mode().IsRegular(), fi.IsDir():
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			return nil // sockets, devices, fifos: not part of a context
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = rel
		if fi.IsDir() {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.CopyN(tw, f, h.Size)
			f.Close()
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("%s shrank while it was read (a file in use? leave it out with .dockerignore)", rel)
			}
			return err
		}
		return nil
	})
	if err != nil {
		return contextError{fmt.Errorf("build context %s: %w", dir, err)}
	}
	return tw.Close()
}
