package seccompbpf

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// run runs p in x/net/bpf's interpreter on a call. The interpreter loads words big endian, so
// each field is written big endian at the place the kernel's (little-endian) struct has it:
// the low half of an argument first.
func run(t *testing.T, vm *bpf.VM, arch, nr uint32, args [6]uint64) uint32 {
	t.Helper()
	data := make([]byte, 64)
	binary.BigEndian.PutUint32(data[offNr:], nr)
	binary.BigEndian.PutUint32(data[offArch:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(data[offArgs+8*i:], uint32(a))
		binary.BigEndian.PutUint32(data[offArgs+8*i+4:], uint32(a>>32))
	}
	out, err := vm.Run(data)
	if err != nil {
		t.Fatalf("run the filter: %v", err)
	}
	return uint32(out)
}

func vmOf(t *testing.T, p Program) *bpf.VM {
	t.Helper()
	ins := make([]bpf.Instruction, len(p))
	for i, in := range p {
		ins[i] = bpf.RawInstruction{Op: in.Code, Jt: in.Jt, Jf: in.Jf, K: in.K}.Disassemble()
		if _, raw := ins[i].(bpf.RawInstruction); raw {
			t.Fatalf("instruction %d (%+v) is not one the interpreter knows", i, in)
		}
	}
	vm, err := bpf.NewVM(ins)
	if err != nil {
		t.Fatalf("the interpreter refuses the program: %v", err)
	}
	return vm
}

// want is what a profile answers for a call, worked out from the profile directly: the
// semantics of the package doc, independently of the compiler's layout.
func want(p *specs.LinuxSeccomp, arch, nr uint32, args [6]uint64) uint32 {
	if arch != nativeAudit || hasX32 && nr&x32Bit != 0 && nr != 0xffffffff {
		return unix.SECCOMP_RET_KILL_PROCESS
	}
	act := func(a specs.LinuxSeccompAction, errno *uint) uint32 {
		v, err := action(a, errno)
		if err != nil {
			panic(err)
		}
		return v
	}
	var highest uint32
	for _, r := range p.Syscalls {
		for _, n := range r.Names {
			if num, ok := syscalls[n]; ok {
				highest = max(highest, num)
			}
		}
	}
	holds := func(c specs.LinuxSeccompArg) bool {
		a := args[c.Index]
		switch c.Op {
		case specs.OpEqualTo:
			return a == c.Value
		case specs.OpNotEqual:
			return a != c.Value
		case specs.OpLessThan:
			return a < c.Value
		case specs.OpLessEqual:
			return a <= c.Value
		case specs.OpGreaterThan:
			return a > c.Value
		case specs.OpGreaterEqual:
			return a >= c.Value
		case specs.OpMaskedEqual:
			return a&c.Value == c.ValueTwo
		}
		panic(c.Op)
	}
	for _, r := range p.Syscalls {
		if !slices.ContainsFunc(r.Names, func(n string) bool { num, ok := syscalls[n]; return ok && num == nr }) {
			continue
		}
		idx := map[uint]int{}
		for _, c := range r.Args {
			idx[c.Index]++
		}
		repeated := false
		for _, n := range idx {
			repeated = repeated || n > 1
		}
		ok := true
		if repeated { // any one comparison
			ok = slices.ContainsFunc(r.Args, holds)
		} else {
			for _, c := range r.Args {
				ok = ok && holds(c)
			}
		}
		if ok {
			return act(r.Action, r.ErrnoRet)
		}
	}
	def := act(p.DefaultAction, p.DefaultErrnoRet)
	if nr > highest && def != unix.SECCOMP_RET_ALLOW {
		return unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	}
	return def
}

// sigchld is the exit signal of a fork's clone, in its flags.
const sigchld = uint64(unix.SIGCHLD)

// interesting are argument values at the edges of the default profile's comparisons.
var interesting = []uint64{0, 1, 2, 3, 7, 8, 9, 16, 40, 41, 131072, 131080, 0xfffffffe, 0xffffffff,
	1 << 32, 1<<32 | 8, 1<<32 | 0xffffffff, 1 << 63, 0xffffffffffffffff,
	2114060288, unix.CLONE_NEWUSER, unix.CLONE_NEWNS | sigchld, unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD,
	sigchld, 0x1_7e020000}

func dockerProfile(t *testing.T, caps []string) *specs.LinuxSeccomp {
	t.Helper()
	s := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}}}
	p, err := seccomp.GetDefaultProfile(s)
	if err != nil {
		t.Fatal(err)
	}
	p.Architectures = []specs.Arch{nativeArch}
	return p
}

// TestDockerProfile compiles Docker's default profile (as the runc runtime uses it: an
// ordinary sandbox's capabilities, and CAP_SYS_ADMIN for a sandbox that runs calls) and checks
// the program's answer for every call number this architecture has, and some it has not, with
// each argument at values around the profile's comparisons, another architecture and x32.
func TestDockerProfile(t *testing.T) {
	if len(syscalls) == 0 {
		t.Skip("no system call table for this architecture")
	}
	plain := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
		"CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW", "CAP_SYS_CHROOT", "CAP_MKNOD", "CAP_AUDIT_WRITE", "CAP_SETFCAP"}
	for name, caps := range map[string][]string{"plain": plain, "calls": append(slices.Clone(plain), "CAP_SYS_ADMIN")} {
		t.Run(name, func(t *testing.T) {
			p := dockerProfile(t, caps)
			prog, err := Compile(p)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d instructions", len(prog))
			vm := vmOf(t, prog)
			nrs := []uint32{500, 1000, 0xffff, 0x3fffffff, x32Bit, x32Bit | 1, 0xffffffff}
			for _, nr := range syscalls {
				nrs = append(nrs, nr)
			}
			checked := 0
			for _, nr := range nrs {
				for _, a := range interesting {
					args := [6]uint64{a, a ^ 1, 0, 0, 0, 0}
					if got, w := run(t, vm, nativeAudit, nr, args), want(p, nativeAudit, nr, args); got != w {
						t.Fatalf("call %d args %#x: the program answers %#x, the profile %#x", nr, args, got, w)
					}
					checked++
				}
			}
			for _, nr := range []uint32{syscalls["read"], syscalls["socket"]} {
				if got := run(t, vm, unix.AUDIT_ARCH_I386, nr, [6]uint64{}); got != unix.SECCOMP_RET_KILL_PROCESS {
					t.Errorf("call %d of another architecture: %#x, want kill", nr, got)
				}
			}
			// A few answers spelled out, so that the reference cannot be wrong the same way.
			args := func(a uint64) [6]uint64 { return [6]uint64{a} }
			eperm, allow := unix.SECCOMP_RET_ERRNO|uint32(unix.EPERM), uint32(unix.SECCOMP_RET_ALLOW)
			for _, c := range []struct {
				call string
				arg  uint64
				want uint32
			}{
				{"read", 0, allow}, {"keyctl", 0, eperm}, {"clone3", 0, unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
				{"socket", unix.AF_INET, allow}, {"socket", unix.AF_VSOCK, eperm}, {"socket", 1<<32 | unix.AF_INET, eperm},
				{"personality", 0xffffffff, allow}, {"personality", 1, eperm},
			} {
				if name == "calls" && c.call == "clone3" {
					continue // CAP_SYS_ADMIN allows it
				}
				if got := run(t, vm, nativeAudit, syscalls[c.call], args(c.arg)); got != c.want {
					t.Errorf("%s(%#x): %#x, want %#x", c.call, c.arg, got, c.want)
				}
			}
			clone := func(flags uint64) uint32 { return run(t, vm, nativeAudit, syscalls["clone"], args(flags)) }
			if name == "plain" && (clone(sigchld) != allow || clone(unix.CLONE_NEWUSER|sigchld) != eperm) {
				t.Errorf("clone: fork %#x, a new user namespace %#x; want allowed and EPERM", clone(sigchld), clone(unix.CLONE_NEWUSER|sigchld))
			}
			if checked < 300*len(interesting) {
				t.Fatalf("checked %d calls", checked)
			}
		})
	}
}

// TestComparisons compiles random profiles that use every comparison on every argument, with
// rules that compare one argument twice (alternatives), and checks the program against the
// profile on values around each comparison's.
func TestComparisons(t *testing.T) {
	if len(syscalls) == 0 {
		t.Skip("no system call table for this architecture")
	}
	ops := []specs.LinuxSeccompOperator{specs.OpEqualTo, specs.OpNotEqual, specs.OpLessThan, specs.OpLessEqual,
		specs.OpGreaterThan, specs.OpGreaterEqual, specs.OpMaskedEqual}
	names := []string{"read", "write", "openat", "socket", "ioctl", "mmap", "prctl", "clone", "kill", "fcntl"}
	r := rand.New(rand.NewPCG(1, 2))
	value := func() uint64 {
		switch r.IntN(4) {
		case 0:
			return uint64(r.IntN(16))
		case 1:
			return uint64(r.Uint32())
		case 2:
			return r.Uint64()
		}
		return uint64(r.IntN(4))<<32 | uint64(r.IntN(4))
	}
	for round := range 200 {
		errno := uint(unix.EACCES)
		p := &specs.LinuxSeccomp{DefaultAction: specs.ActErrno}
		var values []uint64
		for _, name := range names {
			act := []specs.LinuxSeccompAction{specs.ActAllow, specs.ActErrno, specs.ActKillProcess, specs.ActTrap, specs.ActLog}[r.IntN(5)]
			for range 1 + r.IntN(3) {
				rule := specs.LinuxSyscall{Names: []string{name}, Action: act}
				if act == specs.ActErrno {
					rule.ErrnoRet = &errno
				}
				for range r.IntN(3) {
					c := specs.LinuxSeccompArg{Index: uint(r.IntN(6)), Op: ops[r.IntN(len(ops))], Value: value(), ValueTwo: value()}
					if c.Op == specs.OpMaskedEqual {
						c.ValueTwo &= c.Value
					}
					rule.Args = append(rule.Args, c)
					values = append(values, c.Value, c.Value-1, c.Value+1, c.ValueTwo, c.Value^(1<<32))
				}
				p.Syscalls = append(p.Syscalls, rule)
			}
		}
		prog, err := Compile(p)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		vm := vmOf(t, prog)
		for _, name := range append(names, "getpid") {
			for range 60 {
				var args [6]uint64
				for i := range args {
					args[i] = values[r.IntN(len(values))]
				}
				nr := syscalls[name]
				if got, w := run(t, vm, nativeAudit, nr, args), want(p, nativeAudit, nr, args); got != w {
					t.Fatalf("round %d, %s%#x: the program answers %#x, the profile %#x\nprofile %+v", round, name, args, got, w, p.Syscalls)
				}
			}
		}
	}
}

// TestRefused checks that what Compile cannot compile exactly is refused as unsupported (the
// runtime then leaves the profile to runc).
func TestRefused(t *testing.T) {
	if len(syscalls) == 0 {
		t.Skip("no system call table for this architecture")
	}
	allow := []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow}}
	for name, p := range map[string]*specs.LinuxSeccomp{
		"compat architectures": {DefaultAction: specs.ActErrno, Architectures: []specs.Arch{nativeArch, specs.ArchX86}, Syscalls: allow},
		"listener":             {DefaultAction: specs.ActErrno, ListenerPath: "/run/x.sock", Syscalls: allow},
		"flags":                {DefaultAction: specs.ActErrno, Flags: []specs.LinuxSeccompFlag{specs.LinuxSeccompFlagLog}, Syscalls: allow},
		"notify action":        {DefaultAction: specs.ActErrno, Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActNotify}}},
		"mixed actions": {DefaultAction: specs.ActErrno, Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow},
			{Names: []string{"read"}, Action: specs.ActErrno, Args: []specs.LinuxSeccompArg{{Index: 0, Op: specs.OpEqualTo, Value: 3}}}}},
	} {
		if _, err := Compile(p); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: %v, want unsupported", name, err)
		}
	}
	if _, err := Compile(&specs.LinuxSeccomp{DefaultAction: specs.ActErrno, Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow,
		Args: []specs.LinuxSeccompArg{{Index: 6, Op: specs.OpEqualTo}}}}}); err == nil {
		t.Error("argument index 6 compiled")
	}
}

func TestEncode(t *testing.T) {
	if len(syscalls) == 0 {
		t.Skip("no system call table for this architecture")
	}
	p, err := Compile(dockerProfile(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(p.Encode())
	if err != nil || !slices.Equal(got, p) {
		t.Fatalf("decode(encode(p)): %v; equal %v", err, slices.Equal(got, p))
	}
	for _, bad := range []string{"", "!!", "AAAA", "AAAAAAAAAA=="} {
		if _, err := Decode(bad); err == nil {
			t.Errorf("Decode(%q) succeeded", bad)
		}
	}
}
