package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	corral "github.com/corral-dev/corral/sdk/go"
)

// location is one side of a cp: a local path, "-" (stdin or stdout), or a path in a sandbox.
type location struct {
	sandbox string // empty for local
	path    string
}

func (l location) remote() bool { return l.sandbox != "" }

// parseLocation reads "ID:/path" as a sandbox path, anything else as local. As in docker cp, a
// local path containing ":" must have a "/" before it ("./a:b").
func parseLocation(s string) (location, error) {
	i := strings.Index(s, ":")
	if i <= 0 || strings.ContainsAny(s[:i], `/\`) {
		return location{path: s}, nil
	}
	l := location{sandbox: s[:i], path: s[i+1:]}
	if !strings.HasPrefix(l.path, "/") {
		return l, usagef("%q: the path in the sandbox must be absolute (ID:/path)", s)
	}
	return l, nil
}

func (a *app) newCpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories between a sandbox and the local machine",
		Long: `Copy a file or a directory between a sandbox and the local machine; one side is
ID:/path, the other a local path or "-".

A directory is copied with its contents. When DST is an existing directory, SRC is
copied into it under its own name; otherwise DST becomes the copy. Missing parent
directories in the sandbox are created.

"-" as SRC reads stdin: a tar stream to extract when DST is an existing directory in the
sandbox, else the content of the file DST. "-" as DST writes the file's content to stdout,
or a tar stream when SRC is a directory.`,
		Example: `  corral cp ./src ID:/work/src
  corral cp ID:/work/report.json .
  corral cp ID:/var/log - | less
  tar -C build -c . | corral cp - ID:/opt/app`,
		Args: exactArgs(2, "SRC and DST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := parseLocation(args[0])
			if err != nil {
				return err
			}
			dst, err := parseLocation(args[1])
			if err != nil {
				return err
			}
			switch {
			case src.remote() == dst.remote():
				return usagef("cp copies between a sandbox and the local machine: exactly one of SRC and DST must be ID:/path")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if src.remote() {
				return a.copyOut(cmd.Context(), c, src, dst.path)
			}
			return a.copyIn(cmd.Context(), c, src.path, dst)
		},
	}
}

// copyOut copies src in a sandbox to the local path dst.
func (a *app) copyOut(ctx context.Context, c *corral.Client, src location, dst string) error {
	st, err := c.Stat(ctx, src.sandbox, src.path)
	if err != nil {
		return err
	}
	open := c.ReadFile
	if st.IsDir {
		open = c.TarOut
	}
	if dst == "-" {
		rc, err := open(ctx, src.sandbox, src.path)
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = io.Copy(a.stdout, rc)
		return err
	}

	target := dst
	local, lerr := os.Stat(dst)
	switch {
	case lerr == nil && local.IsDir():
		if base := path.Base(src.path); base != "/" {
			target = filepath.Join(dst, base)
		}
	case lerr == nil && st.IsDir:
		return fmt.Errorf("cannot copy directory %s onto file %s", src.path, dst)
	case !errors.Is(lerr, os.ErrNotExist):
		return lerr
	case strings.HasSuffix(dst, "/") || strings.HasSuffix(dst, string(filepath.Separator)):
		return fmt.Errorf("local directory %s does not exist", dst)
	}

	rc, err := open(ctx, src.sandbox, src.path)
	if err != nil {
		return err
	}
	defer rc.Close()
	if st.IsDir {
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		return extractTree(ctx, rc, target)
	}
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, st.Mode.Perm()|0o200)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, rc); err != nil {
		f.Close()
		return fmt.Errorf("copy %s: %w", src.path, err)
	}
	return f.Close()
}

// copyIn copies the local path src (or stdin for "-") to dst in a sandbox.
func (a *app) copyIn(ctx context.Context, c *corral.Client, src string, dst location) error {
	st, err := c.Stat(ctx, dst.sandbox, dst.path)
	exists := err == nil
	if err != nil && !corral.IsNotFound(err) {
		return err
	}
	dstIsDir := exists && st.IsDir

	if src == "-" {
		if dstIsDir {
			return c.TarIn(ctx, dst.sandbox, dst.path, a.stdin)
		}
		_, err := c.WriteFile(ctx, dst.sandbox, dst.path, a.stdin, corral.WriteFileOptions{Parents: true})
		return err
	}

	if resolved, err := filepath.EvalSymlinks(src); err == nil {
		src = resolved
	}
	local, err := os.Stat(src)
	if err != nil {
		return err
	}
	target := dst.path
	if dstIsDir || (!exists && strings.HasSuffix(dst.path, "/")) {
		target = path.Join(dst.path, filepath.Base(src))
	}

	if !local.IsDir() {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = c.WriteFile(ctx, dst.sandbox, target, f, corral.WriteFileOptions{Mode: local.Mode().Perm(), Parents: true})
		return err
	}

	if exists && !st.IsDir {
		return fmt.Errorf("cannot copy directory %s onto file %s", src, dst.path)
	}
	if _, err := c.Mkdir(ctx, dst.sandbox, corral.MkdirRequest{Path: target, Parents: true}); err != nil && !corral.IsConflict(err) {
		return err
	}
	pr, pw := io.Pipe()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tarDone := make(chan error, 1)
	go func() {
		err := writeTree(wctx, src, pw)
		pw.CloseWithError(err)
		tarDone <- err
	}()
	err = c.TarIn(ctx, dst.sandbox, target, pr)
	// If the upload failed early, stop the writer blocked on the pipe.
	pr.CloseWithError(errors.New("upload ended"))
	cancel()
	if terr := <-tarDone; terr != nil && err == nil {
		return fmt.Errorf("read %s: %w", src, terr)
	}
	return err
}
