// Command budget uses up one per-user kernel budget inside a sandbox and reports how far it
// got: "<count> <error>" on stdout. Used by TestSandboxBudgets (internal/e2e).
//
//	budget inotify N    inotify instances, at most N
//	budget watches N    watches of one inotify instance on N files of a new directory
//	budget mqueue N     POSIX message queues of 1 message of 1 KiB, at most N
//	budget procs N      child processes (each sleeps), at most N
//
// With -hold it then keeps what it took until killed.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	hold := flag.Bool("hold", false, "keep what was taken until killed")
	flag.Parse()
	if flag.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: budget [-hold] inotify|watches|mqueue|procs N")
		os.Exit(2)
	}
	n, _ := strconv.Atoi(flag.Arg(1))
	count, err := take(flag.Arg(0), n)
	fmt.Printf("%d %v\n", count, err)
	for *hold {
		unix.Pause() // a select{} would be a deadlock to the runtime
	}
}

func take(what string, n int) (int, error) {
	switch what {
	case "inotify":
		for i := 0; i < n; i++ {
			if _, err := unix.InotifyInit1(0); err != nil {
				return i, err
			}
		}
	case "watches":
		fd, err := unix.InotifyInit1(0)
		if err != nil {
			return 0, err
		}
		dir, err := os.MkdirTemp("", "watches")
		if err != nil {
			return 0, err
		}
		for i := 0; i < n; i++ {
			p := filepath.Join(dir, strconv.Itoa(i))
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				return i, err
			}
			if _, err := unix.InotifyAddWatch(fd, p, unix.IN_MODIFY); err != nil {
				return i, err
			}
		}
	case "mqueue":
		attr := [8]int64{0, 1, 1024, 0} // struct mq_attr: flags, maxmsg, msgsize, curmsgs, reserved
		for i := 0; i < n; i++ {
			name, _ := unix.BytePtrFromString(fmt.Sprintf("budget-%d-%d", os.Getpid(), i))
			_, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(name)), uintptr(unix.O_CREAT|unix.O_RDWR|unix.O_EXCL),
				0o600, uintptr(unsafe.Pointer(&attr[0])), 0, 0)
			if e != 0 {
				return i, e
			}
		}
	case "procs":
		for i := 0; i < n; i++ {
			cmd := exec.Command("/bin/sleep", "600")
			if err := cmd.Start(); err != nil {
				return i, err
			}
		}
	default:
		return 0, fmt.Errorf("unknown budget %q", what)
	}
	return n, nil
}
