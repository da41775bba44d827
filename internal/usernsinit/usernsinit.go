// Package usernsinit holds the two short-lived host processes the runc runtime starts from the
// agent's binary (a small static one, so they start in a millisecond or two) around a sandbox
// that runs in a user namespace of its own (internal/runtime/runc/userns.go):
//
//   - HelperCmd is started already inside the new namespace, whose owner is the sandbox's host
//     uid: it sets the namespace's own inotify limits (/proc/sys/user, which only a holder of
//     CAP_SYS_RESOURCE in the namespace may change, and the sandbox lacks it), prints "ok" and
//     waits for its standard input to close, holding the namespace for runc to join.
//   - RlimitExecCmd sets its own rlimits and executes runc: runc sets a container's rlimits
//     with prlimit(2) from outside, which for a process of another user namespace needs
//     CAP_SYS_RESOURCE; without it (Corral in a container of its own) runc's processes, the
//     sandbox's included, inherit them from this one instead.
//
// It depends on nothing but the standard library and x/sys, so linking it costs the agent
// nothing.
package usernsinit

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// The subcommands (argv[1]).
const (
	HelperCmd     = "userns-init"
	RlimitExecCmd = "rlimit-exec"
)

// Main runs the subcommand args[0] (HelperCmd or RlimitExecCmd, with its arguments) and
// returns the exit code; RlimitExecCmd does not return when it succeeds.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	switch args[0] {
	case HelperCmd:
		return helper(args[1:], stdin, stdout)
	case RlimitExecCmd:
		return rlimitExec(args[1:], stderr)
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

var rlimits = map[string]int{"RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_NPROC": unix.RLIMIT_NPROC, "RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE}

// rlimitExec: args are NAME=SOFT:HARD..., "--", then the program and its arguments.
func rlimitExec(args []string, stderr io.Writer) int {
	for len(args) > 0 && args[0] != "--" {
		k, v, _ := strings.Cut(args[0], "=")
		soft, hard, _ := strings.Cut(v, ":")
		res, ok := rlimits[k]
		s, err1 := strconv.ParseUint(soft, 10, 64)
		h, err2 := strconv.ParseUint(hard, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			fmt.Fprintf(stderr, "%s: bad limit %q\n", RlimitExecCmd, args[0])
			return 2
		}
		// syscall.Setrlimit, not unix's: it tells the runtime not to put its own RLIMIT_NOFILE
		// back in the program it executes.
		if err := syscall.Setrlimit(res, &syscall.Rlimit{Cur: s, Max: h}); err != nil {
			fmt.Fprintf(stderr, "%s: set %s: %v\n", RlimitExecCmd, k, err)
			return 1
		}
		args = args[1:]
	}
	if len(args) < 2 {
		fmt.Fprintf(stderr, "%s: no command\n", RlimitExecCmd)
		return 2
	}
	err := syscall.Exec(args[1], args[1:], os.Environ())
	fmt.Fprintf(stderr, "%s: exec %s: %v\n", RlimitExecCmd, args[1], err)
	return 1
}

// RlimitArgs returns the arguments of RlimitExecCmd for limits (NAME, soft, hard) and argv.
func RlimitArgs(names []string, soft, hard []uint64, argv []string) []string {
	args := []string{RlimitExecCmd}
	for i, n := range names {
		args = append(args, fmt.Sprintf("%s=%d:%d", n, soft[i], hard[i]))
	}
	return append(append(args, "--"), argv...)
}
