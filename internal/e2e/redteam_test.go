package e2e

// The red-team suite (issue 22 item 9): every attack on Corral's boundaries that the issue lists,
// each replayed from inside sandboxes (as root) or through the API on every runtime it applies
// to, each asserting the attack fails and, where Corral counts it, that it was counted. `make
// redteam` runs it (go test -run TestRedTeam). Attacks that older tests already cover are run
// from here by TestRedTeamCovered, so this table is the one place listing every case.
//
//	Attack (issue 22)                                        Test (runtimes)
//	-------------------------------------------------------  ------------------------------------------------------------
//	ptrace of PID 1                                          TestRedTeamCovered/AgentNotPtraceable (runc, gvisor, microvm)
//	                                                         TestRedTeamSandbox/*/ptrace_of_PID_1 (+ fncall)
//	ptrace of a sibling: another sandbox's processes         TestRedTeamSandbox/*/other_sandbox's_processes_invisible (not
//	                                                         even visible); another exec's in the same sandbox: see item 2
//	/proc/1/{fd,mem,environ,root,exe}                        TestRedTeamSandbox/*/proc_1_* (+ fncall);
//	                                                         TestRedTeamCovered/HarnessUnreachable, HarnessUnreachableGVisor
//	kill of PID 1                                            TestRedTeamSandbox/*/kill_PID_1 (runc, microvm, fncall);
//	                                                         gVisor: TestRedTeamCovered/HarnessUnreachableGVisor (the
//	                                                         sandbox ends cleanly, nothing else does)
//	agent channel hijack (item 1)                            TestRedTeamGVisorChannel (redteam_gvisor_channel_test.go)
//	exec a background process cannot touch (item 2)          TestRedTeamExclusive (redteam_exclusive_test.go)
//	/proc and /sys masks (kcore, kpagecgroup, kpageflags,    TestRedTeamSandbox/*/mask_* (+ fncall)
//	  keys, sysrq-trigger, timer_list, sched_debug,
//	  /sys/firmware, /proc/sys and /sys read-only)
//	mknod (block device, /dev/mem) then open                 TestRedTeamSandbox/*/mknod_*
//	mount (proc, tmpfs, bind), remount                       TestRedTeamSandbox/*/mount_*, remount_*
//	unshare (mount, user -U, -Ur then mount, net, pid)       TestRedTeamSandbox/*/unshare_*
//	raw and packet sockets (no CAP_NET_RAW)                  TestRedTeamSandbox/*/raw_sockets; TestRedTeamNetwork/*/raw_sockets
//	symlink / hard-link tricks through `corral cp` in, out   TestRedTeamFiles/*/cp_*; a hostile stream to cp out (what a
//	                                                         hijacked agent could send): cli TestExtractTreeStaysInside
//	files API through symlinks (to /proc/1/root, ../../,     TestRedTeamFiles/*/files_*
//	  host paths): read, write, stat, list, move
//	tar upload: symlink then file through it, hardlink out,  TestRedTeamFiles/*/tar_in_*; TestRedTeamCovered/Files
//	  absolute names, ".." entries, device nodes
//	tar download: links kept as links, /proc refused         TestRedTeamFiles/*/tar_out_*
//	layer import of hostile tars: traversal, symlink escape, TestRedTeamLayerImport/*
//	  hardlink outside, device nodes, huge sparse file,
//	  deep nesting, gzip bomb (ratio), size limit
//	tar bombs on upload: bytes (the disk limit), gzip        TestRedTeamFiles/*/tar_in_bomb
//	entry-count limits (1M entries, upload and import)       unit tests only: agentrpc TestTarInRejectsEscapes, layers TestImportRejects
//	                                                         (too slow end to end; not configurable on corral up)
//	disk, memory, CPU, pids limits (oom_killed recorded)     TestRedTeamCovered/Limits (runc, gvisor, microvm)
//	output limit (truncation recorded)                       TestRedTeamCovered/ReattachAndOutputCap; TestRedTeamFloods/*/yes_flood
//	`yes` floods: output capped, API and neighbours respond  TestRedTeamFloods/*/yes_flood; TestRedTeamSandbox/fncall/yes_flood
//	fork bombs: pids limit holds, sandbox usable (gVisor:    TestRedTeamFloods/*/fork_bomb; TestRedTeamSandbox/fncall/fork_bomb
//	  fails cleanly, alone), host and neighbours fine
//	network: sandbox to sandbox                              TestRedTeamNetwork/*/sandbox_to_sandbox
//	network: sandbox to host, API port on every host address TestRedTeamNetwork/*/host_addresses_and_the_API_port (counted:
//	                                                         item 7's file)
//	DNS tunnelling (long random names, over-long and base64  TestRedTeamNetwork/*/dns_tunnel
//	  names, TXT) get no answer and are counted
//	Host header / SNI spoofing                               TestRedTeamNetwork/*/host_header_*, sni_*
//	IPv6: no v6 address, route or egress                     TestRedTeamNetwork/*/ipv6
//	metadata address 169.254.169.254 blocked, counted        TestRedTeamNetwork/*/metadata
//	egress policy, DNS bypass, counters (runc, gvisor)       TestRedTeamCovered/EgressPolicy
//	cross-project API access (exec, files, get, delete,      TestRedTeamCrossProject
//	  pause, snapshot, trajectory, commands, network)
//	token escalation (token, grant, role, quota)             TestRedTeamTokenEscalation; TestRedTeamCovered/AgentRolloutCLI
//	fncall artifacts per project (item 3)                    TestRedTeamTenancyArtifacts (redteam_tenancy_test.go)
//	data directory modes, secrets in logs (item 4)           TestRedTeam* in redteam_hostfiles_test.go
//	snapshots and layers private (item 5)                    TestRedTeamTenancyLayers (redteam_tenancy_test.go)
//	no privilege in snapshots and imports (item 6)           TestRedTeamSnapshotPrivilege (redteam_snapshot_test.go)
//	blocked attempts at the host counted (item 7)            TestRedTeam* in redteam_hostnet_test.go
//	terminal escapes from sandbox output (item 8)            TestRedTeamTerminal (redteam_terminal_test.go; the real CLI on a
//	                                                         pseudo-terminal); cli TestTerminalEscaping, FuzzTermEscaper
//	webhooks into the host's network (SSRF: corral's API on  TestRedTeamWebhook (redteam_webhook_test.go; issue 28):
//	  loopback, private, metadata addresses; non-http URLs)    refused at the dial, logged and counted

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestRedTeamCovered runs, as part of the suite, the older tests that already replay attacks of
// the list above. In a full `go test` run (no -run pattern naming the suite) they run under
// their own names, so this one skips rather than run them twice.
func TestRedTeamCovered(t *testing.T) {
	if !strings.Contains(flag.Lookup("test.run").Value.String(), "RedTeam") {
		t.Skip("these tests run under their own names in the full suite; `make redteam` runs them here")
	}
	for _, c := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"HarnessUnreachable", TestHarnessUnreachable},
		{"HarnessUnreachableGVisor", TestHarnessUnreachableGVisor},
		{"AgentNotPtraceable", TestAgentNotPtraceable},
		{"Limits", TestLimits},
		{"ReattachAndOutputCap", TestReattachAndOutputCap},
		{"Files", TestFiles},
		{"EgressPolicy", TestEgressPolicy},
		{"AgentRolloutCLI", TestAgentRolloutCLI},
	} {
		t.Run(c.name, c.f)
	}
}

// redteamProbe is a static program run inside sandboxes for the attacks a shell cannot make.
//
//	probe ptrace PID        PTRACE_ATTACH; prints "attached" or the error
//	probe mem PID           reads PID's memory at its first mapping; "read" or "denied"
//	probe raw               opens raw IPv4, IPv6 and packet sockets; "refused" or what opened
//	probe tls ADDR:PORT SNI a TLS handshake naming SNI; "handshake" or "refused"
//	probe dial NET ADDR     a connection (tcp, tcp6, udp...); "connected" or "refused"
//	probe dials NET ADDR... connections to each at once; "none" or "connected" and those that did
//	probe dnsq NAME QTYPE   one raw DNS query (labels unchecked); "answered" or "no answer"
//	probe sigqueue PID SIG  queues SIG to PID (rt_sigqueueinfo, SI_QUEUE); "refused" or "sent"
//	probe setsig PID SIG    has a pipe's SIGIO, set to SIG (F_SETSIG), sent to PID; "refused" or "sent"
const redteamProbe = `package main

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

func main() {
	switch os.Args[1] {
	case "sigqueue":
		pid, _ := strconv.Atoi(os.Args[2])
		sig, _ := strconv.Atoi(os.Args[3])
		var info [128]byte
		info[0] = byte(sig)
		info[8], info[9], info[10], info[11] = 0xff, 0xff, 0xff, 0xff // si_code -1: SI_QUEUE
		if _, _, e := syscall.RawSyscall(syscall.SYS_RT_SIGQUEUEINFO, uintptr(pid), uintptr(sig), uintptr(unsafe.Pointer(&info[0]))); e != 0 {
			fmt.Println("refused")
			return
		}
		fmt.Println("sent")
	case "setsig":
		pid, _ := strconv.Atoi(os.Args[2])
		sig, _ := strconv.Atoi(os.Args[3])
		var p [2]int
		if err := syscall.Pipe(p[:]); err != nil {
			fmt.Println(err)
			return
		}
		fd := uintptr(p[0])
		fcntl := func(cmd, arg uintptr) syscall.Errno {
			_, _, e := syscall.RawSyscall(syscall.SYS_FCNTL, fd, cmd, arg)
			return e
		}
		if fcntl(syscall.F_SETOWN, uintptr(pid)) != 0 || fcntl(syscall.F_SETSIG, uintptr(sig)) != 0 {
			fmt.Println("refused")
			return
		}
		fcntl(syscall.F_SETFL, syscall.O_ASYNC)
		syscall.Write(p[1], []byte("x"))
		fmt.Println("sent")
	case "ptrace":
		pid, _ := strconv.Atoi(os.Args[2])
		if err := syscall.PtraceAttach(pid); err != nil {
			fmt.Println(err)
			return
		}
		syscall.PtraceDetach(pid)
		fmt.Println("attached")
	case "mem":
		f, err := os.Open("/proc/" + os.Args[2] + "/maps")
		if err != nil {
			fmt.Println("denied")
			return
		}
		line, _ := bufio.NewReader(f).ReadString('\n')
		addr, err := strconv.ParseUint(strings.SplitN(line, "-", 2)[0], 16, 64)
		if err != nil {
			fmt.Println("denied")
			return
		}
		m, err := os.Open("/proc/" + os.Args[2] + "/mem")
		if err != nil {
			fmt.Println("denied")
			return
		}
		if _, err := m.ReadAt(make([]byte, 16), int64(addr)); err != nil {
			fmt.Println("denied")
			return
		}
		fmt.Println("read")
	case "raw":
		var got []string
		for _, s := range []struct {
			name           string
			domain, typ, p int
		}{{"raw", syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_ICMP}, {"raw6", syscall.AF_INET6, syscall.SOCK_RAW, syscall.IPPROTO_ICMPV6},
			{"packet", syscall.AF_PACKET, syscall.SOCK_RAW, 0x0300}} {
			if fd, err := syscall.Socket(s.domain, s.typ, s.p); err == nil {
				syscall.Close(fd)
				got = append(got, s.name+" opened")
			}
		}
		if len(got) == 0 {
			fmt.Println("refused")
			return
		}
		fmt.Println(strings.Join(got, ", "))
	case "tls":
		d := net.Dialer{Timeout: 3 * time.Second}
		c, err := tls.DialWithDialer(&d, "tcp", os.Args[2], &tls.Config{ServerName: os.Args[3], InsecureSkipVerify: true})
		if err != nil {
			fmt.Println("refused")
			return
		}
		c.Close()
		fmt.Println("handshake")
	case "dnsq":
		// dnsq NAME QTYPE: one raw query to the resolver of /etc/resolv.conf, labels unchecked.
		conf, _ := os.ReadFile("/etc/resolv.conf")
		server := ""
		for _, l := range strings.Split(string(conf), "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[0] == "nameserver" && server == "" {
				server = f[1]
			}
		}
		q := []byte{0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}
		for _, label := range strings.Split(os.Args[2], ".") {
			q = append(append(q, byte(len(label))), label...)
		}
		qtype, _ := strconv.Atoi(os.Args[3])
		q = append(q, 0, byte(qtype>>8), byte(qtype), 0, 1)
		c, err := net.DialTimeout("udp", net.JoinHostPort(server, "53"), 2*time.Second)
		if err != nil {
			fmt.Println("no answer")
			return
		}
		c.SetDeadline(time.Now().Add(3 * time.Second))
		c.Write(q)
		b := make([]byte, 1500)
		n, err := c.Read(b)
		if err != nil || n < 12 || b[3]&0xf != 0 || b[6]|b[7] == 0 {
			fmt.Println("no answer")
			return
		}
		fmt.Println("answered")
	case "dials":
		// dials NET ADDR...: all at once; prints each that connected, or "none".
		var mu sync.Mutex
		var wg sync.WaitGroup
		var got []string
		for _, a := range os.Args[3:] {
			wg.Add(1)
			go func(a string) {
				defer wg.Done()
				if c, err := net.DialTimeout(os.Args[2], a, 3*time.Second); err == nil {
					c.Close()
					mu.Lock()
					got = append(got, a)
					mu.Unlock()
				}
			}(a)
		}
		wg.Wait()
		if len(got) == 0 {
			fmt.Println("none")
			return
		}
		fmt.Println("connected", strings.Join(got, " "))
	case "dial":
		c, err := net.DialTimeout(os.Args[2], os.Args[3], 2*time.Second)
		if err != nil {
			fmt.Println("refused")
			return
		}
		c.Close()
		fmt.Println("connected")
	}
}
`

var (
	probeOnce sync.Once
	probeBin  []byte
	probeErr  error
)

// probeBinary builds redteamProbe once per test binary and returns it.
func probeBinary(t *testing.T) []byte {
	t.Helper()
	probeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "corral-redteam-probe-")
		if err != nil {
			probeErr = err
			return
		}
		defer os.RemoveAll(dir)
		os.WriteFile(filepath.Join(dir, "main.go"), []byte(redteamProbe), 0o644)
		os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module probe\ngo 1.21\n"), 0o644)
		build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", "probe", ".")
		build.Dir = dir
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			probeErr = err
			probeBin = out
			return
		}
		probeBin, probeErr = os.ReadFile(filepath.Join(dir, "probe"))
	})
	if probeErr != nil {
		t.Fatalf("build the red-team probe: %v\n%s", probeErr, probeBin)
	}
	return probeBin
}
