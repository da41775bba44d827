// Package rlimitenv carries a runc sandbox's rlimits to its agent in the environment, for hosts
// where runc cannot set them. runc sets a container's rlimits with prlimit(2) from outside, which
// for a process in another user namespace needs CAP_SYS_RESOURCE; without it (Corral in a
// container of its own) the runtime leaves them out of config.json and sets EnvVar instead, and
// the agent, the sandbox's first process, sets them on itself before anything else runs. Every
// limit is at most what it inherits (the runtime caps them by its own hard limits), so lowering
// needs no capability; every process of the sandbox descends from the agent and inherits them.
//
// It depends on nothing but the standard library and x/sys, so linking it costs the agent nothing.
package rlimitenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// EnvVar holds the limits: NAME=SOFT:HARD, comma-separated.
const EnvVar = "CORRAL_RLIMITS"

// Limit is one rlimit by its OCI name (RLIMIT_NOFILE).
type Limit struct {
	Name       string
	Soft, Hard uint64
}

// resources are the limits the runtime sets; any other name is refused.
var resources = map[string]int{
	"RLIMIT_NOFILE":   unix.RLIMIT_NOFILE,
	"RLIMIT_NPROC":    unix.RLIMIT_NPROC,
	"RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE,
}

// Encode returns EnvVar's assignment for limits, or an error for a name this package does not set.
func Encode(limits []Limit) (string, error) {
	parts := make([]string, 0, len(limits))
	for _, l := range limits {
		if _, ok := resources[l.Name]; !ok {
			return "", fmt.Errorf("rlimit %s cannot be set by the agent", l.Name)
		}
		if l.Soft > l.Hard {
			return "", fmt.Errorf("rlimit %s: soft %d is over hard %d", l.Name, l.Soft, l.Hard)
		}
		parts = append(parts, l.Name+"="+strconv.FormatUint(l.Soft, 10)+":"+strconv.FormatUint(l.Hard, 10))
	}
	return EnvVar + "=" + strings.Join(parts, ","), nil
}

// Decode parses EnvVar's value.
func Decode(s string) ([]Limit, error) {
	var out []Limit
	for _, p := range strings.Split(s, ",") {
		name, v, ok1 := strings.Cut(p, "=")
		soft, hard, ok2 := strings.Cut(v, ":")
		_, known := resources[name]
		sv, err1 := strconv.ParseUint(soft, 10, 64)
		hv, err2 := strconv.ParseUint(hard, 10, 64)
		if !ok1 || !ok2 || !known || err1 != nil || err2 != nil || sv > hv {
			return nil, fmt.Errorf("%s: bad limit %q", EnvVar, p)
		}
		out = append(out, Limit{Name: name, Soft: sv, Hard: hv})
	}
	return out, nil
}

// ApplyFromEnv sets the limits in EnvVar, if it is set, on this process and removes the variable
// from its environment (its children never see it). An error means the process must not go on:
// a limit it was given is not in force.
func ApplyFromEnv() error {
	s, ok := os.LookupEnv(EnvVar)
	if !ok {
		return nil
	}
	os.Unsetenv(EnvVar)
	limits, err := Decode(s)
	if err != nil {
		return err
	}
	for _, l := range limits {
		// syscall.Setrlimit, not unix's: for RLIMIT_NOFILE it tells the Go runtime not to put
		// its own start-up limit back in the programs this process starts.
		if err := syscall.Setrlimit(resources[l.Name], &syscall.Rlimit{Cur: l.Soft, Max: l.Hard}); err != nil {
			return fmt.Errorf("set %s to %d:%d: %w", l.Name, l.Soft, l.Hard, err)
		}
	}
	return nil
}
