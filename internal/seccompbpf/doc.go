// Package seccompbpf compiles an OCI seccomp profile (Docker's default, as the runc runtime
// renders it) into a classic BPF program once, so that a sandbox's start does not: runc compiles
// the profile with libseccomp in every container's init, which measured 6-9 ms of CPU per
// start on the development VM (scripts/bench-seccomp-start.sh; docs/BENCHMARKS.md). The runc runtime
// hands the program to the sandbox's agent (its PID 1), which installs it on all its threads
// before it does anything else (Program.Install); every process of the sandbox descends from the
// agent and inherits the filter.
//
// What Compile accepts is what it can compile exactly, and anything else is an error the caller
// answers by leaving the profile to runc: the native architecture alone (no compat
// sub-architectures), the actions allow, errno, kill (thread or process), trap and log, argument
// comparisons of every kind on the six arguments, no listener and no flags. The semantics are
// runc's with libseccomp:
//   - A call whose architecture is not the native one, or (amd64) an x32 call, kills the
//     process (runc kills the thread; a process of threads of which one was killed for a
//     forbidden ABI is of no use). Call -1, which a tracer sets to skip a call, is no x32 call.
//   - A call no rule names gets the default action, except calls numbered above every call the
//     profile names: they get ENOSYS, as runc's patched filter answers them, so that a C
//     library falls back from a call newer than the profile.
//   - The rules naming a call are alternatives: the call gets a rule's action when all of that
//     rule's argument comparisons hold (runc splits a rule with two comparisons of one argument
//     into one rule per comparison, and so does Compile); a rule without comparisons always
//     holds. Rules of one call with different actions are refused (libseccomp orders them by its
//     own priorities), as are names this architecture does not have, which are skipped the way
//     runc skips them.
//   - Arguments are compared as 64-bit values, as libseccomp does on a 64-bit architecture;
//     SCMP_CMP_MASKED_EQ is (arg & value) == valueTwo.
//
// CompileGuarded adds guards (Guard): conditions on the low 32 bits of a call's arguments, checked
// before the profile's rules, that refuse the call with EPERM. They say what an OCI profile
// cannot: "this call, except with this int argument", since a profile's comparisons are 64-bit
// and a caller sets the high half of an int argument at will (the kernel ignores it).
//
// The program is a binary search over the named call numbers, so a call costs about ten
// comparisons whatever the profile's size (a linear chain of Docker's ~370 calls costs up to
// that many).
//
//go:generate go run ./gen
package seccompbpf
