// Package usernsinit holds the short-lived host process the runc runtime starts from the
// agent's binary (a small static one, so it starts in a millisecond or two) for a sandbox that
// runs in a user namespace of its own (internal/runtime/runc/userns.go): HelperCmd is started
// already inside the new namespace, whose owner is the sandbox's host uid; it sets the
// namespace's own inotify limits (/proc/sys/user, which only a holder of CAP_SYS_RESOURCE in the
// namespace may change, and the sandbox lacks it), prints "ok" and waits for its standard input
// to close, holding the namespace for runc to join. (Rlimits runc cannot set from outside the
// namespace reach the agent in its environment: internal/rlimitenv.)
//
// It depends on nothing but the standard library, so linking it costs the agent
// nothing. cmd/corral-runcd/usernsinit.c is its twin in C (the same arguments, answers and
// exit codes, without a Go runtime's start), which the runtime uses where corral-runcd is.
package usernsinit

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// HelperCmd is the helper's subcommand (argv[1]).
const HelperCmd = "userns-init"

// Main runs the subcommand args[0] (HelperCmd, with its arguments) and returns the exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if args[0] == HelperCmd {
		return helper(args[1:], stdin, stdout)
	}
	fmt.Fprintf(stderr, "usernsinit: unknown command %q\n", args[0])
	return 2
}

// helper: args are max_inotify_instances=N and max_inotify_watches=N.
func helper(args []string, stdin io.Reader, stdout io.Writer) int {
	for _, a := range args {
		k, v, _ := strings.Cut(a, "=")
		if k != "max_inotify_instances" && k != "max_inotify_watches" {
			fmt.Fprintf(stdout, "unknown setting %q\n", a)
			return 2
		}
		// Read in this namespace, with its CAP_SYS_RESOURCE: sets this namespace's limit.
		if err := os.WriteFile("/proc/sys/user/"+k, []byte(v), 0); err != nil {
			fmt.Fprintf(stdout, "set %s: %v\n", k, err)
			return 1
		}
	}
	io.WriteString(stdout, "ok\n")
	io.Copy(io.Discard, stdin)
	return 0
}
