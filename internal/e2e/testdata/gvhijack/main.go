// Command gvhijack plays root inside a sandbox trying to take over the agent's control channel,
// step by step, as the finding of issue 22 item 1 did on gVisor (TestRedTeamGVisorChannel):
//
//	gvhijack scan         look for the channel: socket files, /proc/net/unix, the agent's
//	                      descriptors; connect to every socket found and to the old path, list
//	                      the agent's commands and quiesce it; unlink the old socket
//	gvhijack forge PATH   bind a socket at PATH (and an abstract one) and answer every
//	                      connection with a forged reply, counting them in /tmp/forger.hits
//
// Each step prints one line "step: result"; the test reads them.
package main

import (
	"bufio"
	"context"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
)

// oldSocket is where the agent of a gVisor sandbox listened before the channel moved out.
const oldSocket = "/.corral/agent.sock"

func main() {
	if len(os.Args) > 2 && os.Args[1] == "forge" {
		forge(os.Args[2])
		return
	}
	scan()
}

func scan() {
	var socks []string
	filepath.WalkDir("/", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && (p == "/proc" || p == "/sys") {
			return fs.SkipDir
		}
		if d.Type()&fs.ModeSocket != 0 {
			socks = append(socks, p)
		}
		return nil
	})
	fmt.Printf("socket files: %d %q\n", len(socks), socks)

	var unixSocks []string
	if f, err := os.Open("/proc/net/unix"); err == nil {
		sc := bufio.NewScanner(f)
		sc.Scan() // the header
		for sc.Scan() {
			if line := strings.TrimSpace(sc.Text()); line != "" {
				unixSocks = append(unixSocks, line)
				if fields := strings.Fields(line); len(fields) >= 8 {
					socks = append(socks, fields[7])
				}
			}
		}
		f.Close()
	}
	fmt.Printf("unix sockets: %d %q\n", len(unixSocks), unixSocks)

	_, err := os.ReadDir("/proc/1/fd")
	fmt.Printf("list agent fds: %s\n", result(err))
	var opened []string
	for fd := range 32 {
		for _, flag := range []int{os.O_RDONLY, os.O_WRONLY} {
			if f, err := os.OpenFile("/proc/1/fd/"+strconv.Itoa(fd), flag, 0); err == nil {
				opened = append(opened, fmt.Sprintf("%d/%d", fd, flag))
				f.Close()
			}
		}
	}
	fmt.Printf("open agent fds: %d %q\n", len(opened), opened)

	for _, p := range append(socks, oldSocket) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c := agentrpc.NewClient(p)
		_, err := c.Commands(ctx)
		fmt.Printf("list commands via %s: %s\n", p, result(err))
		// The agent has no quiesce op any more; what the old hijack needed first was to reach
		// the agent through the socket at all, which Ping tests.
		_, err = c.Ping(ctx)
		fmt.Printf("quiesce via %s: %s\n", p, result(err))
		cancel()
	}
	fmt.Printf("unlink %s: %s\n", oldSocket, result(os.Remove(oldSocket)))
}

// forge binds path and an abstract socket and serves forged replies until killed.
func forge(path string) {
	os.MkdirAll(filepath.Dir(path), 0o755)
	os.Remove(path)
	var hits atomic.Int64
	os.WriteFile("/tmp/forger.hits", []byte("0\n"), 0o644)
	serve := func(ln net.Listener) {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n := hits.Add(1)
			os.WriteFile("/tmp/forger.hits", []byte(strconv.FormatInt(n, 10)+"\n"), 0o644)
			// What a forger would say: a finished command with output of its choosing.
			fmt.Fprintf(c, `{"type":"stdout","data":"Rk9SR0VECg=="}`+"\n"+`{"type":"exit","exit":{"code":0}}`+"\n")
			c.Close()
		}
	}
	var bound []string
	for _, p := range []string{path, "@corral-agent"} {
		ln, err := net.Listen("unix", p)
		if err != nil {
			fmt.Printf("bind %s: %s\n", p, result(err))
			continue
		}
		bound = append(bound, p)
		go serve(ln)
	}
	fmt.Printf("forger bound: %q\n", bound)
	os.WriteFile("/tmp/forger.ready", []byte(strings.Join(bound, " ")+"\n"), 0o644)
	select {}
}

func result(err error) string {
	if err == nil {
		return "ok"
	}
	return "refused (" + err.Error() + ")"
}
