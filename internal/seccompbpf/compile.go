package seccompbpf

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// ErrUnsupported marks a profile Compile does not compile (the caller leaves it to runc).
var ErrUnsupported = errors.New("not compiled in process")

// MaxInstructions is the kernel's bound on a filter's length (BPF_MAXINSNS).
const MaxInstructions = 4096

// x32Bit marks a call of amd64's x32 ABI.
const x32Bit = 0x40000000

// Offsets in struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6];}, little endian (amd64
// and arm64): an argument's low half comes first.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// Program is a compiled seccomp filter.
type Program []unix.SockFilter

// rule is one alternative of a call: its action when every comparison holds.
type rule struct {
	conds  []specs.LinuxSeccompArg
	action uint32
}

// call is what a profile says of one call number.
type call struct {
	rules  []rule  // in the profile's order; one with no comparisons makes the rest moot
	guards []Guard // checked before the rules
}

// A Guard refuses a call with EPERM, before and whatever the profile says of it, when all its
// conditions hold. Its comparisons read an argument's low 32 bits, which is all the kernel reads
// of an int argument: a profile's 64-bit comparisons cannot refuse one value of such an
// argument and allow the others, since a caller may set the high half at will.
type Guard struct {
	Call  string
	Conds []GuardCond
}

// GuardCond is one condition of a Guard on argument Arg: its low 32 bits are one of In, or, with
// NonZero, the whole argument (a pointer) is not 0.
type GuardCond struct {
	Arg     uint
	In      []uint32
	NonZero bool
}

// Compile compiles p for this architecture (see the package doc for what it accepts).
func Compile(p *specs.LinuxSeccomp) (Program, error) {
	return CompileGuarded(p, nil)
}

// CompileGuarded compiles p with guards checked first for their calls.
func CompileGuarded(p *specs.LinuxSeccomp, guards []Guard) (Program, error) {
	if len(syscalls) == 0 {
		return nil, fmt.Errorf("%w: no system call table for this architecture", ErrUnsupported)
	}
	if p.ListenerPath != "" || len(p.Flags) > 0 {
		return nil, fmt.Errorf("%w: a listener or flags", ErrUnsupported)
	}
	for _, a := range p.Architectures {
		if a != nativeArch {
			return nil, fmt.Errorf("%w: architecture %s besides the native %s", ErrUnsupported, a, nativeArch)
		}
	}
	def, err := action(p.DefaultAction, p.DefaultErrnoRet)
	if err != nil {
		return nil, fmt.Errorf("default action: %w", err)
	}
	calls := map[uint32]*call{}
	var maxNr uint32
	for i, r := range p.Syscalls {
		act, err := action(r.Action, r.ErrnoRet)
		if err != nil {
			return nil, fmt.Errorf("syscalls[%d]: %w", i, err)
		}
		alts, err := alternatives(r.Args)
		if err != nil {
			return nil, fmt.Errorf("syscalls[%d]: %w", i, err)
		}
		for _, name := range r.Names {
			nr, ok := syscalls[name]
			if !ok {
				continue // not a call of this architecture (runc skips those too)
			}
			maxNr = max(maxNr, nr)
			c := calls[nr]
			if c == nil {
				c = &call{}
				calls[nr] = c
			}
			for _, conds := range alts {
				if len(c.rules) > 0 && c.rules[0].action != act {
					return nil, fmt.Errorf("%w: %s has rules with different actions", ErrUnsupported, name)
				}
				c.rules = append(c.rules, rule{conds: conds, action: act})
			}
		}
	}
	for _, c := range calls {
		if slices.ContainsFunc(c.rules, func(r rule) bool { return len(r.conds) == 0 }) {
			c.rules = []rule{{action: c.rules[0].action}}
		}
	}
	for i, g := range guards {
		nr, ok := syscalls[g.Call]
		if !ok {
			continue // not a call of this architecture
		}
		if len(g.Conds) == 0 {
			return nil, fmt.Errorf("guards[%d] (%s): no condition", i, g.Call)
		}
		for _, c := range g.Conds {
			if c.Arg > 5 || (len(c.In) == 0) == !c.NonZero {
				return nil, fmt.Errorf("guards[%d] (%s): a condition is on argument 0-5 and is either In or NonZero", i, g.Call)
			}
		}
		c := calls[nr]
		if c == nil {
			// Not named by the profile: the default action, after the guard.
			c = &call{rules: []rule{{action: def}}}
			calls[nr] = c
			maxNr = max(maxNr, nr)
		}
		c.guards = append(c.guards, g)
	}
	return assemble(calls, def, maxNr)
}

// alternatives are the comparisons of one rule as alternatives of ANDed comparisons: one, or,
// when an argument is compared twice, one per comparison (as runc adds them).
func alternatives(args []specs.LinuxSeccompArg) ([][]specs.LinuxSeccompArg, error) {
	seen := map[uint]bool{}
	split := false
	for _, a := range args {
		if a.Index > 5 {
			return nil, fmt.Errorf("argument index %d: a call has 6", a.Index)
		}
		switch a.Op {
		case specs.OpEqualTo, specs.OpNotEqual, specs.OpLessThan, specs.OpLessEqual,
			specs.OpGreaterThan, specs.OpGreaterEqual, specs.OpMaskedEqual:
		default:
			return nil, fmt.Errorf("%w: comparison %q", ErrUnsupported, a.Op)
		}
		split = split || seen[a.Index]
		seen[a.Index] = true
	}
	if !split {
		return [][]specs.LinuxSeccompArg{args}, nil
	}
	out := make([][]specs.LinuxSeccompArg, len(args))
	for i, a := range args {
		out[i] = []specs.LinuxSeccompArg{a}
	}
	return out, nil
}

// action is the filter's return value for a profile's action.
func action(a specs.LinuxSeccompAction, errno *uint) (uint32, error) {
	switch a {
	case specs.ActAllow:
		return unix.SECCOMP_RET_ALLOW, nil
	case specs.ActErrno:
		e := uint(unix.EPERM)
		if errno != nil {
			e = *errno
		}
		if e > 0xffff {
			return 0, fmt.Errorf("errno %d is out of range", e)
		}
		return unix.SECCOMP_RET_ERRNO | uint32(e), nil
	case specs.ActKill, specs.ActKillThread:
		return unix.SECCOMP_RET_KILL_THREAD, nil
	case specs.ActKillProcess:
		return unix.SECCOMP_RET_KILL_PROCESS, nil
	case specs.ActTrap:
		return unix.SECCOMP_RET_TRAP, nil
	case specs.ActLog:
		return unix.SECCOMP_RET_LOG, nil
	}
	return 0, fmt.Errorf("%w: action %q", ErrUnsupported, a)
}

// Encode is p as text (base64 of the kernel's struct sock_filter array), for an environment
// variable.
func (p Program) Encode() string {
	b := make([]byte, 0, 8*len(p))
	for _, in := range p {
		b = binary.LittleEndian.AppendUint16(b, in.Code)
		b = append(b, in.Jt, in.Jf)
		b = binary.LittleEndian.AppendUint32(b, in.K)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// Decode reads a program Encode wrote.
func Decode(s string) (Program, error) {
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("seccomp program: %w", err)
	}
	if len(b) == 0 || len(b)%8 != 0 || len(b)/8 > MaxInstructions {
		return nil, fmt.Errorf("seccomp program: %d bytes is not 1 to %d instructions", len(b), MaxInstructions)
	}
	p := make(Program, len(b)/8)
	for i := range p {
		in := b[8*i:]
		p[i] = unix.SockFilter{Code: binary.LittleEndian.Uint16(in), Jt: in[2], Jf: in[3], K: binary.LittleEndian.Uint32(in[4:])}
	}
	return p, nil
}
