package seccompbpf

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// helperEnv makes the test binary the helper of TestInstall: it installs the program in EnvVar
// and reports what a few calls answer.
const helperEnv = "SECCOMPBPF_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "1":
		os.Exit(helper())
	case "guards":
		os.Exit(guardsHelper())
	}
	os.Exit(m.Run())
}

func helper() int {
	if err := InstallFromEnv(); err != nil {
		fmt.Printf("install: %v\n", err)
		return 1
	}
	if _, set := os.LookupEnv(EnvVar); set {
		fmt.Println("the variable is still set")
		return 1
	}
	errno := func(_, _ uintptr, e unix.Errno) string {
		if e == 0 {
			return "ok"
		}
		return e.Error()
	}
	status, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "Seccomp:") || strings.HasPrefix(l, "NoNewPrivs:") {
			fmt.Println(strings.Join(strings.Fields(l), " "))
		}
	}
	fmt.Println("getpid", errno(unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0)))
	fmt.Println("keyctl", errno(unix.RawSyscall(unix.SYS_KEYCTL, 0, 0, 0)))
	fmt.Println("clone3", errno(unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)))
	fmt.Println("personality-query", errno(unix.RawSyscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)))
	fmt.Println("personality-1", errno(unix.RawSyscall(unix.SYS_PERSONALITY, 1, 0, 0)))
	fmt.Println("socket-vsock", errno(unix.RawSyscall(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM, 0)))
	fd, _, e := unix.RawSyscall(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM, 0)
	fmt.Println("socket-unix", errno(0, 0, e))
	unix.Close(int(fd))
	fmt.Println("unshare-user", errno(unix.RawSyscall(unix.SYS_UNSHARE, unix.CLONE_NEWUSER, 0, 0)))
	fmt.Println("beyond", errno(unix.RawSyscall(1000, 0, 0, 0)))
	return 0
}

// TestInstall installs Docker's default profile, compiled, in a child process and checks the
// kernel's answers: the kernel takes the program, and the calls it refuses and allows are the
// profile's (arguments read as the kernel lays them out).
func TestInstall(t *testing.T) {
	if len(syscalls) == 0 {
		t.Skip("no system call table for this architecture")
	}
	p, err := Compile(dockerProfile(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", EnvVar+"="+p.Encode())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	want := []string{
		"NoNewPrivs: 1", "Seccomp: 2", "getpid ok", "keyctl operation not permitted", "clone3 function not implemented",
		"personality-query ok", "personality-1 operation not permitted", "socket-vsock operation not permitted",
		"socket-unix ok", "unshare-user operation not permitted", "beyond function not implemented",
	}
	for _, w := range want {
		if !strings.Contains(string(out), w+"\n") {
			t.Errorf("the helper did not say %q:\n%s", w, out)
		}
	}
}

// testGuards refuse what the runc runtime's guards refuse (internal/runtime/runc): queued
// SIGSEGV or SIGBUS, and F_SETSIG to SIGSEGV.
var testGuards = []Guard{
	{Call: "rt_sigqueueinfo", Conds: []GuardCond{{Arg: 1, In: []uint32{uint32(unix.SIGSEGV), uint32(unix.SIGBUS)}}}},
	{Call: "pidfd_send_signal", Conds: []GuardCond{{Arg: 1, In: []uint32{uint32(unix.SIGSEGV)}}, {Arg: 2, NonZero: true}}},
	{Call: "fcntl", Conds: []GuardCond{{Arg: 1, In: []uint32{unix.F_SETSIG}}, {Arg: 2, In: []uint32{uint32(unix.SIGSEGV)}}}},
}

// guardsHelper installs the program in EnvVar and reports what guarded calls answer. The
// signals go to a process that does not exist, so a call the guards let through fails with
// ESRCH (or EBADF) instead of crashing the helper.
func guardsHelper() int {
	if err := InstallFromEnv(); err != nil {
		fmt.Printf("install: %v\n", err)
		return 1
	}
	errno := func(_, _ uintptr, e unix.Errno) string {
		if e == 0 {
			return "ok"
		}
		return e.Error()
	}
	const nobody = 0x3ffffff0 // no such PID
	var info [128]byte
	info[8] = 0xff // si_code -1, SI_QUEUE: little endian int at offset 8
	info[9], info[10], info[11] = 0xff, 0xff, 0xff
	in := uintptr(unsafe.Pointer(&info[0]))
	high := uintptr(1) << 32
	fmt.Println("sigqueue-segv", errno(unix.RawSyscall(unix.SYS_RT_SIGQUEUEINFO, nobody, uintptr(unix.SIGSEGV), in)))
	fmt.Println("sigqueue-segv-high", errno(unix.RawSyscall(unix.SYS_RT_SIGQUEUEINFO, nobody, high|uintptr(unix.SIGSEGV), in)))
	fmt.Println("sigqueue-bus", errno(unix.RawSyscall(unix.SYS_RT_SIGQUEUEINFO, nobody, uintptr(unix.SIGBUS), in)))
	fmt.Println("sigqueue-usr1", errno(unix.RawSyscall(unix.SYS_RT_SIGQUEUEINFO, nobody, uintptr(unix.SIGUSR1), in)))
	fmt.Println("pidfd-segv-info", errno(unix.RawSyscall6(unix.SYS_PIDFD_SEND_SIGNAL, 1<<20, uintptr(unix.SIGSEGV), in, 0, 0, 0)))
	fmt.Println("pidfd-segv-noinfo", errno(unix.RawSyscall6(unix.SYS_PIDFD_SEND_SIGNAL, 1<<20, uintptr(unix.SIGSEGV), 0, 0, 0, 0)))
	var p [2]int
	if err := unix.Pipe(p[:]); err != nil {
		fmt.Printf("pipe: %v\n", err)
		return 1
	}
	fd := uintptr(p[0])
	fmt.Println("setsig-segv", errno(unix.RawSyscall(unix.SYS_FCNTL, fd, unix.F_SETSIG, uintptr(unix.SIGSEGV))))
	fmt.Println("setsig-segv-high", errno(unix.RawSyscall(unix.SYS_FCNTL, fd, high|unix.F_SETSIG, high|uintptr(unix.SIGSEGV))))
	fmt.Println("setsig-io", errno(unix.RawSyscall(unix.SYS_FCNTL, fd, unix.F_SETSIG, uintptr(unix.SIGIO))))
	fmt.Println("getfl", errno(unix.RawSyscall(unix.SYS_FCNTL, fd, unix.F_GETFL, 0)))
	fmt.Println("getpid", errno(unix.RawSyscall(unix.SYS_GETPID, 0, 0, 0)))
	return 0
}

// TestGuards installs Docker's default profile compiled with guards in a child process: the
// guarded values are refused, whatever the arguments' high halves, and the rest of each call
// is the profile's.
func TestGuards(t *testing.T) {
	if len(syscalls) == 0 {
		t.Skip("no system call table for this architecture")
	}
	p, err := CompileGuarded(dockerProfile(t, nil), testGuards)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=guards", EnvVar+"="+p.Encode())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	const refused = "operation not permitted"
	want := []string{
		"sigqueue-segv " + refused, "sigqueue-segv-high " + refused, "sigqueue-bus " + refused,
		"sigqueue-usr1 no such process", "pidfd-segv-info " + refused, "pidfd-segv-noinfo bad file descriptor",
		"setsig-segv " + refused, "setsig-segv-high " + refused, "setsig-io ok", "getfl ok", "getpid ok",
	}
	for _, w := range want {
		if !strings.Contains(string(out), w+"\n") {
			t.Errorf("the helper did not say %q:\n%s", w, out)
		}
	}
	if _, err := CompileGuarded(dockerProfile(t, nil), []Guard{{Call: "fcntl"}}); err == nil {
		t.Error("a guard without conditions compiled")
	}
}
