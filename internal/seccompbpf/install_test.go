package seccompbpf

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// helperEnv makes the test binary the helper of TestInstall: it installs the program in EnvVar
// and reports what a few calls answer.
const helperEnv = "SECCOMPBPF_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(helper())
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
