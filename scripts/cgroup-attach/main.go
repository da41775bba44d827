// Command cgroup-attach measures what moving a fresh process into a cgroup costs on this host
// (the step of every sandbox's start that cgroup v2's favordynmods speeds up): N times, a new
// `sleep` is started and its PID written to DIR/cgroup.procs, GAP apart so each move finds the
// kernel idle. Run as root:
//
//	go run ./scripts/cgroup-attach [-n 20] [-gap 200ms] /sys/fs/cgroup/pids/corral-attach-test
//
// It prints p50, min and max, and removes DIR.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"time"
)

func main() {
	n := flag.Int("n", 20, "moves")
	gap := flag.Duration("gap", 200*time.Millisecond, "pause between moves")
	flag.Parse()
	if flag.NArg() != 1 || *n < 1 {
		fmt.Fprintln(os.Stderr, "usage: cgroup-attach [-n N] [-gap D] CGROUP_DIR")
		os.Exit(2)
	}
	dir := flag.Arg(0)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer os.Remove(dir)
	var ds []time.Duration
	for range *n {
		c := exec.Command("sleep", "10")
		if err := c.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return
		}
		t := time.Now()
		err := os.WriteFile(dir+"/cgroup.procs", []byte(strconv.Itoa(c.Process.Pid)), 0)
		ds = append(ds, time.Since(t))
		c.Process.Kill()
		c.Wait()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return
		}
		time.Sleep(*gap)
	}
	slices.Sort(ds)
	fmt.Printf("%s: %d moves, p50 %v, min %v, max %v\n", dir, len(ds), ds[len(ds)/2], ds[0], ds[len(ds)-1])
}
