package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	corral "github.com/corral-dev/corral/sdk/go"
)

// newFncallCmd is `corral fncall`: fncall environments (pools of warm containers for calls).
func (a *app) newFncallCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fncall",
		Short: "Fncall environments: pools of warm containers that run stateless calls (corral call)",
		Args:  exactArgs(0, "a subcommand: create, ls, get or rm"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cmd.Help()
		},
	}
	var base, workspace, timeout, queueWait, memory, files string
	var toolkits, netAllow, netDeny, warmImports []string
	var warmInterp, project string
	var poolMin, poolMax, queueDepth int
	var cpus float64
	create := &cobra.Command{
		Use:   "create NAME --base N:V [--workspace N:V] [--toolkit N:V]... [--pool-min N] [--pool-max N] [--timeout D] [--project PATH]",
		Short: "Define an fncall environment and start its pool",
		Example: `  corral fncall create judge --base base:default --pool-min 2 --pool-max 8 --timeout 10s
  corral call judge -- sh -c 'echo hello'`,
		Args: exactArgs(1, "an fncall environment NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if base == "" {
				return usagef("--base is required")
			}
			for _, r := range append([]string{base, workspace}, toolkits...) {
				if r != "" {
					if err := checkRef("layer", r); err != nil {
						return err
					}
				}
			}
			env := corral.FncallEnv{Name: args[0], Project: project, Base: base, Workspace: workspace, Toolkits: toolkits,
				PoolMin: poolMin, PoolMax: poolMax, Timeout: timeout, QueueDepth: queueDepth, QueueWait: queueWait,
				Limits: corral.Limits{CPUs: cpus}}
			if len(warmImports) > 0 || warmInterp != "" {
				env.Warm = &corral.WarmPython{Interpreter: warmInterp, Imports: warmImports}
			}
			if len(netAllow) > 0 || len(netDeny) > 0 {
				env.Network = &corral.NetworkPolicy{Allow: netAllow, Deny: netDeny}
			}
			var err error
			if memory != "" {
				if env.Limits.MemoryBytes, err = parseSize(memory); err != nil {
					return usagef("--memory: %v", err)
				}
			}
			if files != "" {
				if env.FilesBytes, err = parseSize(files); err != nil {
					return usagef("--files-bytes: %v", err)
				}
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			out, err := c.CreateFncallEnv(cmd.Context(), env)
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(out)
			}
			_, err = fmt.Fprintln(a.stdout, out.Name)
			return err
		},
	}
	f := create.Flags()
	f.StringVar(&base, "base", "", "base layer NAME:VERSION (or NAME:TAG)")
	f.StringVar(&workspace, "workspace", "", "workspace layer NAME:VERSION")
	f.StringArrayVar(&toolkits, "toolkit", nil, "toolkit layer NAME:VERSION, stacked in the order given (repeatable)")
	f.IntVar(&poolMin, "pool-min", 0, "containers kept ready (default 1)")
	f.IntVar(&poolMax, "pool-max", 0, "most containers under load (default 4)")
	f.StringVar(&timeout, "timeout", "", "a call's default and largest timeout (default 30s)")
	f.IntVar(&queueDepth, "queue-depth", 0, "calls that may wait for a container (default 64); more get 429")
	f.StringVar(&queueWait, "queue-wait", "", "how long a call may wait for a container (default 10s)")
	f.Float64Var(&cpus, "cpus", 0, "CPU quota of each container, in cores")
	f.StringVar(&memory, "memory", "", "memory limit of each container, e.g. 512M")
	f.StringArrayVar(&netAllow, "net-allow", nil, "egress the containers' calls may use: a catalog service, a domain or CIDR[:PORT][/tcp|udp] (repeatable; default: none)")
	f.StringArrayVar(&netDeny, "net-deny", nil, "egress refused even if allowed (repeatable)")
	f.StringSliceVar(&warmImports, "warm-python", nil, "keep a Python interpreter ready in each container with these modules imported (comma-separated, repeatable)")
	f.StringVar(&warmInterp, "warm-interpreter", "", "the warm interpreter's program (default python3)")
	f.StringVar(&files, "files-bytes", "", "most a call may write (its private writable layer, in memory; default 64M)")
	f.StringVar(&project, "project", "", "project that owns the environment and is charged for its containers (default: the token's)")

	ls := &cobra.Command{
		Use:   "ls",
		Short: "List fncall environments and their pools",
		Args:  exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.FncallEnvs(cmd.Context())
			if err != nil {
				return err
			}
			if a.jsonOut() {
				if list == nil {
					list = []corral.FncallEnv{}
				}
				return a.printJSON(list)
			}
			t := newTable(a.stdout)
			t.row("NAME", "BASE", "POOL", "READY", "BUSY", "QUEUED", "CALLS", "REJECTED", "TIMEOUT")
			for _, e := range list {
				p := e.Pool
				if p == nil {
					p = &corral.FncallPool{}
				}
				t.row(e.Name, e.Base, fmt.Sprintf("%d-%d", e.PoolMin, e.PoolMax), strconv.Itoa(p.Ready), strconv.Itoa(p.Busy),
					strconv.Itoa(p.Queued), strconv.FormatInt(p.Calls, 10), strconv.FormatInt(p.Rejected, 10), e.Timeout)
			}
			return t.flush()
		},
	}
	get := &cobra.Command{
		Use:   "get NAME",
		Short: "Show an fncall environment and its pool",
		Args:  exactArgs(1, "an fncall environment NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			e, err := c.FncallEnv(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.jsonOut() {
				return a.printJSON(e)
			}
			p := e.Pool
			if p == nil {
				p = &corral.FncallPool{}
			}
			_, err = fmt.Fprintf(a.stdout, "Name:       %s\nBase:       %s\nWorkspace:  %s\nToolkits:   %s\nPool:       %d-%d (ready %d, busy %d, starting %d, queued %d)\nCalls:      %d (rejected %d, containers replaced %d)\nTimeout:    %s\nQueue:      %d calls, %s\n",
				e.Name, e.Base, orDash(e.Workspace), orDash(strings.Join(e.Toolkits, ", ")), e.PoolMin, e.PoolMax,
				p.Ready, p.Busy, p.Starting, p.Queued, p.Calls, p.Rejected, p.Replaced, e.Timeout, e.QueueDepth, e.QueueWait)
			if err == nil && p.LastError != "" {
				_, err = fmt.Fprintf(a.stdout, "Last error: %s\n", p.LastError)
			}
			return err
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Delete an fncall environment and its containers",
		Args:  exactArgs(1, "an fncall environment NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			return c.DeleteFncallEnv(cmd.Context(), args[0])
		},
	}
	cmd.AddCommand(create, ls, get, rm)
	return cmd
}

// newCallCmd is `corral call`: one stateless call in an fncall environment.
func (a *app) newCallCmd() *cobra.Command {
	var files, outs, env, keep, refs []string
	var stdinFile, cwd, timeout, python string
	var shell bool
	var keepTTL string
	cmd := &cobra.Command{
		Use:   "call NAME [--file LOCAL=REMOTE]... [--out REMOTE[=LOCAL]]... [--keep REMOTE]... [--keep-ttl DURATION] [--file-ref REF=REMOTE]... [--stdin FILE] -- CMD ARGS...",
		Short: "Run one stateless call in an fncall environment (nothing of it survives)",
		Long: `Run one command in a warm container of the fncall environment NAME. Input files are
copied in first (REMOTE relative to the working directory, default /call); the command's stdout
and stderr pass through and corral exits with its status; the files named by --out are copied
back (to LOCAL, default the file's name in the current directory). Files named by --keep stay
on the node as artifacts (printed as "kept REMOTE REF" on stderr) for a later call to take with
--file-ref REF=REMOTE, so a binary compiled in one environment runs in another without passing
through the client. Artifacts belong to the environment's project: calls of environments in other
projects, or on other nodes, cannot find them. They live for --keep-ttl (default 10m, at most
24h; each use keeps one at least 10 minutes longer) and count against the project's
artifact_bytes quota. Every process the call starts is killed and everything it wrote is
discarded when it ends.`,
		Example: `  corral call judge --file main.c=main.c --out a.out -- gcc -O2 -o a.out main.c
  corral call build --file main.c=main.c --keep a.out -- gcc -o a.out main.c   # kept a.out sha256:…
  corral call run --file-ref sha256:…=a.out -- ./a.out
  echo 3 | corral call judge --stdin - -- sh -c 'read n; echo $((n*n))'`,
		Args: func(cmd *cobra.Command, args []string) error {
			lead, argv, err := splitCommand(cmd, args, 1, "an fncall environment NAME")
			if err != nil && len(lead) == 1 && len(argv) == 0 && cmd.Flags().Changed("python") {
				return nil // Python code needs no command
			}
			return err
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			lead, argv, _ := splitCommand(cmd, args, 1, "an fncall environment NAME")
			req := corral.CallRequest{Env: env, Cwd: cwd, Timeout: timeout}
			if python != "" {
				if shell {
					return usagef("--python and --shell do not go together")
				}
				b, err := readArg(a, python)
				if err != nil {
					return err
				}
				req.Python, req.Argv = string(b), argv
			} else if shell {
				if len(argv) != 1 {
					return usagef("--shell takes one script argument after --")
				}
				req.Script = argv[0]
			} else {
				req.Argv = argv
			}
			if len(files) > 0 {
				req.Files = map[string][]byte{}
			}
			for _, fv := range files {
				local, remote, ok := strings.Cut(fv, "=")
				if !ok || local == "" || remote == "" {
					return usagef("--file %q: want LOCAL=REMOTE", fv)
				}
				b, err := os.ReadFile(local)
				if err != nil {
					return err
				}
				req.Files[remote] = b
			}
			req.Keep, req.KeepTTL = keep, keepTTL
			for _, fr := range refs {
				ref, remote, ok := strings.Cut(fr, "=")
				if !ok || ref == "" || remote == "" {
					return usagef("--file-ref %q: want REF=REMOTE", fr)
				}
				if req.FileRefs == nil {
					req.FileRefs = map[string]string{}
				}
				req.FileRefs[remote] = ref
			}
			locals := map[string]string{}
			for _, o := range outs {
				remote, local, ok := strings.Cut(o, "=")
				if !ok || local == "" {
					local = filepath.Base(remote)
				}
				req.Outputs = append(req.Outputs, remote)
				locals[remote] = local
			}
			if stdinFile != "" {
				if stdinFile == "-" && python == "-" {
					return usagef("--python - and --stdin - cannot both read this command's stdin")
				}
				b, err := readArg(a, stdinFile)
				if err != nil {
					return err
				}
				req.Stdin = b
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			res, err := c.Call(cmd.Context(), lead[0], req)
			if err != nil {
				if corral.IsExhausted(err) {
					return fmt.Errorf("%w (the pool is busy; retry later)", err)
				}
				return err
			}
			if a.jsonOut() {
				if err := a.printJSON(res); err != nil {
					return err
				}
			} else {
				a.stdout.Write(res.Stdout)
				a.stderr.Write(res.Stderr)
				if res.StdoutTruncated || res.StderrTruncated {
					fmt.Fprintln(a.stderr, "corral: the call's output was cut at its limit")
				}
			}
			for _, k := range keep {
				if ref, ok := res.Artifacts[k]; ok && !a.jsonOut() {
					fmt.Fprintf(a.stderr, "kept %s %s\n", k, ref)
				}
			}
			var failed []string
			for remote, data := range res.Outputs {
				if err := os.WriteFile(locals[remote], data, 0o644); err != nil {
					return err
				}
			}
			for remote, why := range res.OutputErrors {
				failed = append(failed, fmt.Sprintf("%s: %s", remote, why))
			}
			if len(failed) > 0 {
				fmt.Fprintf(a.stderr, "corral: output files not returned: %s\n", strings.Join(failed, "; "))
			}
			code, msg := exitStatus(&res.Exit)
			if msg != "" {
				fmt.Fprintf(a.stderr, "corral: %s\n", msg)
			}
			if code != 0 {
				return exitError{code}
			}
			if len(failed) > 0 {
				return errors.New("some output files were not returned")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&files, "file", nil, "copy LOCAL into the call as REMOTE (repeatable)")
	f.StringArrayVar(&outs, "out", nil, "copy REMOTE back after the call, to LOCAL (default: its name here) (repeatable)")
	f.StringArrayVar(&keep, "keep", nil, "keep REMOTE on the node as an artifact for later calls (repeatable)")
	f.StringVar(&keepTTL, "keep-ttl", "", "how long the node keeps the --keep files (default 10m, at most 24h)")
	f.StringArrayVar(&refs, "file-ref", nil, "write the artifact REF (sha256:…) into the call as REMOTE (repeatable)")
	f.StringVar(&stdinFile, "stdin", "", `file to give the command as stdin ("-" for this command's stdin)`)
	f.StringArrayVarP(&env, "env", "e", nil, "KEY=VALUE for the command (repeatable)")
	f.StringVar(&cwd, "cwd", "", "working directory (default /call)")
	f.StringVar(&timeout, "timeout", "", "kill the call after this long (default: the environment's timeout)")
	f.BoolVar(&shell, "shell", false, "run the one argument after -- with /bin/sh -c")
	f.StringVar(&python, "python", "", `Python code file to run ("-" for stdin) with the environment's warm interpreter; arguments after -- become sys.argv[1:]`)
	return cmd
}

// readArg reads the file a flag names, or this command's stdin for "-".
func readArg(a *app, name string) ([]byte, error) {
	if name != "-" {
		return os.ReadFile(name)
	}
	if a.stdin == nil {
		return nil, usagef("-: no stdin")
	}
	return io.ReadAll(a.stdin)
}
