package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/blobstore/s3test"
	"github.com/corral-dev/corral/internal/layers"
	corral "github.com/corral-dev/corral/sdk/go"
)

// serviceBackWithin is how long each fault case gives the service to come back once the fault
// ends (a create, an exec and a delete succeed again).
const serviceBackWithin = 30 * time.Second

// finishFault stops the load, verifies it, deletes every sandbox, stops corral up and checks that
// nothing of its data dir is left on the host.
func finishFault(t *testing.T, p *corralProc, l *faultLoad) faultReport {
	t.Helper()
	l.stop()
	r := l.verify(p.Client)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := p.Client.ListSandboxes(ctx, corral.ListOptions{})
	if err != nil {
		t.Fatalf("list sandboxes to delete: %v", err)
	}
	for _, sb := range list {
		if sb.State == corral.StateRunning || sb.State == corral.StateCreating || sb.State == corral.StatePaused {
			// A create the fault left running on the node (its client gone) ends within
			// seconds; until then a delete is a retryable 503.
			var err error
			for deadline := time.Now().Add(30 * time.Second); ; {
				if _, err = p.Client.DeleteSandbox(ctx, sb.ID); err == nil || time.Now().After(deadline) {
					break
				}
				if apiErr, ok := errors.AsType[*corral.APIError](err); !ok || apiErr.Status != 503 {
					break
				}
			}
			if err != nil {
				t.Errorf("delete %s at the end: %v", sb.ID, err)
			}
		}
	}
	p.Stop()
	assertNoLeftovers(t, p)
	return r
}

// TestFaultKill9Up kills corral up with SIGKILL under load and starts it again: every sandbox
// keeps running and is re-adopted, nothing acknowledged is lost, and what failed failed with a
// connection error while it was down (or a retryable 503).
func TestFaultKill9Up(t *testing.T) {
	p := withBase(t)
	l := newFaultLoad(t, p.Token, p.URL).start()
	runFor(5 * time.Second)
	end := l.expect(false)
	killed := time.Now()
	p.Kill9()
	p.Restart()
	up := time.Since(killed)
	back := waitService(t, p.Client, serviceBackWithin)
	end()
	runFor(4 * time.Second)
	r := finishFault(t, p, l)
	r.FaultFor, r.RecoveredIn = up, back
	r.log(t, "kill -9 corral up")
}

// TestFaultStoppedControlPlane stops corral up with SIGSTOP for a few seconds under load: the
// sandboxes go on running (a background process keeps ticking), clients see timeouts, and after
// SIGCONT the service is back with nothing lost.
func TestFaultStoppedControlPlane(t *testing.T) {
	p := withBase(t)
	ticker := p.create(corral.CreateRequest{Limits: faultLimits})
	p.sh(ticker.ID, `(while :; do date +%s >> /tmp/ticks; sleep 0.5; done) >/dev/null 2>&1 &`)
	l := newFaultLoad(t, p.Token, p.URL)
	l.opTimeout = 4 * time.Second // an agent's client gives up; a stall shows as timeouts
	l.start()
	runFor(4 * time.Second)
	end := l.expect(true)
	stopped := time.Now()
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	runFor(8 * time.Second)
	syscall.Kill(p.cmd.Process.Pid, syscall.SIGCONT)
	cont := time.Now()
	back := waitService(t, p.Client, serviceBackWithin)
	end()
	runFor(3 * time.Second)
	// The sandbox ran while its control plane was stopped: it ticked in the middle of the stop.
	ticks := 0
	for _, f := range strings.Fields(p.sh(ticker.ID, "cat /tmp/ticks")) {
		if s, err := strconv.ParseInt(f, 10, 64); err == nil && s > stopped.Unix()+1 && s < cont.Unix()-1 {
			ticks++
		}
	}
	if ticks < 4 {
		t.Errorf("the sandbox ticked %d times in the middle of an 8 s stop of its control plane; want it to keep running", ticks)
	}
	r := finishFault(t, p, l)
	r.FaultFor, r.RecoveredIn = cont.Sub(stopped), back
	r.log(t, "SIGSTOP corral up for 8 s")
}

// TestFaultSlowClients runs the load beside clients that never read: commands printing without
// end whose output nobody reads, a large download nobody reads, and one read a byte at a time.
// corral up's memory stays bounded, and the load is served as if they were not there.
func TestFaultSlowClients(t *testing.T) {
	p := withBase(t)
	ctx := context.Background()
	pid := p.cmd.Process.Pid
	big := p.create(corral.CreateRequest{Limits: faultLimits})
	p.sh(big.ID, "head -c 48m /dev/urandom > /root/big")
	before := procRSS(pid)
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	// Eight commands printing as fast as they can; their streams are opened and never read.
	for i := range 8 {
		sb := big
		if i%2 == 1 {
			sb = p.create(corral.CreateRequest{Limits: faultLimits})
		}
		st, err := p.Client.Exec(ctx, sb.ID, corral.ExecRequest{Argv: []string{"sh", "-c", "while :; do echo 0123456789abcdef0123456789abcdef0123456789abcdef; done"}})
		if err != nil {
			t.Fatal(err)
		}
		closers = append(closers, st)
	}
	// Downloads of 48 MiB: three never read, one read slowly.
	for range 3 {
		rc, err := p.Client.ReadFile(ctx, big.ID, "/root/big")
		if err != nil {
			t.Fatal(err)
		}
		closers = append(closers, rc)
	}
	slow, err := p.Client.ReadFile(ctx, big.ID, "/root/big")
	if err != nil {
		t.Fatal(err)
	}
	closers = append(closers, slow)
	slowDone := make(chan int64)
	go func() {
		var n int64
		buf := make([]byte, 512)
		for deadline := time.Now().Add(12 * time.Second); time.Now().Before(deadline); {
			m, err := slow.Read(buf)
			n += int64(m)
			if err != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		slowDone <- n
	}()

	l := newFaultLoad(t, p.Token, p.URL).start()
	var peak int64
	for range 12 {
		runFor(time.Second)
		peak = max(peak, procRSS(pid))
	}
	if n := <-slowDone; n == 0 {
		t.Error("the slow reader got nothing")
	}
	// Bounded: what a stream buffers is capped per stream, not by what the command printed.
	const bound = 256 << 20
	if peak-before > bound {
		t.Errorf("corral up grew from %d MiB to %d MiB with 8 unread commands and 4 unread downloads; want under %d MiB more", before>>20, peak>>20, bound>>20)
	}
	for _, c := range closers {
		c.Close()
	}
	closers = nil
	r := finishFault(t, p, l)
	r.log(t, fmt.Sprintf("8 unread commands, 3 unread and 1 slow 48 MiB downloads (corral up RSS %d -> %d MiB peak)", before>>20, peak>>20))
	for k, st := range r.Stats {
		if st.Failed > 0 {
			t.Errorf("%s: %d of %d failed beside slow clients (nothing else was wrong): %v", k, st.Failed, st.Tried, st.ByClass)
		}
	}
}

// TestFaultCorralsStartStop starts a second and a third Corral beside a first under load, uses
// them and stops them: the first one's load sees nothing, and each leaves nothing behind.
func TestFaultCorralsStartStop(t *testing.T) {
	a := withBase(t)
	l := newFaultLoad(t, a.Token, a.URL).start()
	runFor(3 * time.Second)
	var others []*corralProc
	for range 2 {
		o := startCorralAuto(t)
		o.importDir("base", "test", corral.KindBase, busyboxRootfs(t))
		sb := o.create(corral.CreateRequest{Limits: faultLimits})
		payload := make([]byte, 8<<10)
		rand.Read(payload)
		if _, err := o.Client.WriteFile(context.Background(), sb.ID, "/root/x", bytes.NewReader(payload), corral.WriteFileOptions{}); err != nil {
			t.Fatal(err)
		}
		o.sh(sb.ID, "test -s /root/x")
		others = append(others, o)
	}
	// The third stops first (its sandbox keeps running, by design), then its cleanup; the
	// second goes with `corral down`'s equivalent: its sandboxes deleted, then stopped.
	for i := len(others) - 1; i >= 0; i-- {
		o := others[i]
		if i == 1 {
			o.Stop()
			o.Restart()
		}
		o.cleanup()
		assertNoLeftovers(t, o)
	}
	runFor(3 * time.Second)
	if strings.Contains(a.Logs(), "removing runtime state of a sandbox the store does not run") {
		t.Errorf("the first Corral removed runtime state because of the others:\n%s", a.Logs())
	}
	r := finishFault(t, a, l)
	r.log(t, "a second and a third Corral started, used and stopped beside the first")
	for k, st := range r.Stats {
		if st.Failed > 0 {
			t.Errorf("%s: %d of %d failed on the first Corral while others started and stopped: %v", k, st.Failed, st.Tried, st.ByClass)
		}
	}
}

// versitygwProc finds the versitygw serving endpoint ("http://127.0.0.1:port") and returns its
// pid, command line and environment, to kill it and start it again as it was.
func versitygwProc(t *testing.T, endpoint string) (int, []string, []string) {
	t.Helper()
	addr := strings.TrimPrefix(endpoint, "http://")
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(argv) > 2 && strings.HasSuffix(argv[0], "versitygw") && slices.Contains(argv, addr) {
			env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
			return pid, argv, strings.Split(strings.TrimRight(string(env), "\x00"), "\x00")
		}
	}
	t.Fatalf("no versitygw process serves %s", endpoint)
	return 0, nil, nil
}

// TestFaultBlobStoreOutage takes the blob store (a real versitygw) away under load for a few
// seconds, and brings it back: sandboxes run from their local layers and lose nothing; what
// needs the blob store (a layer import) fails with a retryable 503 while it is gone and works
// once it is back.
func TestFaultBlobStoreOutage(t *testing.T) {
	needRoot(t)
	srv := s3test.Start(t)
	p := withBase(t, "--blob-store", srv.Spec(s3test.Bucket, "faults", "&access_key_file="+srv.KeyFile))
	tk := t.TempDir()
	os.MkdirAll(filepath.Join(tk, "opt/tk"), 0o755)
	importTK := func(c *corral.Client, version string) error {
		os.WriteFile(filepath.Join(tk, "opt/tk/v"), []byte(version), 0o644)
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(layers.WriteTar(context.Background(), tk, pw)) }()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := c.ImportLayer(ctx, "tk", version, corral.KindToolkit, pr)
		return err
	}
	l := newFaultLoad(t, p.Token, p.URL).start()
	runFor(3 * time.Second)
	pid, argv, env := versitygwProc(t, srv.Endpoint)
	end := l.expect(false)
	down := time.Now()
	syscall.Kill(pid, syscall.SIGKILL)
	eventually(t, 5*time.Second, "versitygw gone", func() bool { return syscall.Kill(pid, 0) != nil })
	// While it is gone: an import, which must write to it, fails clearly and retryably (through
	// the load's client, whose wire recorder checks the Retry-After).
	err := importTK(l.clients[0], "1")
	var apiErr *corral.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 503 {
		t.Errorf("a layer import with the blob store down: %v; want a retryable 503", err)
	}
	runFor(3 * time.Second)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	eventually(t, 10*time.Second, "versitygw back", func() bool {
		resp, err := http.Get(srv.Endpoint + "/")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	outage := time.Since(down)
	back := time.Now()
	eventually(t, serviceBackWithin, "a layer import after the blob store came back", func() bool { return importTK(p.Client, "2") == nil })
	backIn := time.Since(back)
	waitService(t, p.Client, serviceBackWithin)
	end()
	sb := p.create(corral.CreateRequest{Toolkits: []string{"tk:2"}, Limits: faultLimits})
	if got := p.sh(sb.ID, "cat /opt/tk/v"); got != "2" {
		t.Errorf("toolkit imported after the outage reads %q", got)
	}
	runFor(2 * time.Second)
	r := finishFault(t, p, l)
	r.FaultFor, r.RecoveredIn = outage, backIn
	r.log(t, "blob store (versitygw) killed, started again 3 s later")
}
