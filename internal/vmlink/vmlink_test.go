package vmlink

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/doccheck"
	"github.com/corral-dev/corral/internal/errdefs"
)

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func testLog(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

// sockDir returns a short temporary directory: unix socket paths are limited to 107 bytes.
func sockDir(t *testing.T) string {
	d, err := os.MkdirTemp("", "vmlink")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// startGuest serves handle for every stream of a guest listener on f's port until the test ends.
func startGuest(t *testing.T, open func() (io.ReadWriteCloser, error), handle func(net.Conn)) net.Listener {
	ln := Listen(open, testLog(t))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					t.Errorf("Accept: %v", err)
				}
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				handle(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return ln
}

// serveTest is the guest's test protocol: the first byte of a stream selects echo ('e') or a
// flood that ends only when the stream fails ('f').
func serveTest(c net.Conn) {
	defer c.Close()
	var op [1]byte
	if _, err := io.ReadFull(c, op[:]); err != nil {
		return
	}
	switch op[0] {
	case 'e':
		io.Copy(c, c)
	case 'f':
		buf := bytes.Repeat([]byte("flood"), 4096)
		for {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}
}

// echoCheck sends size random bytes on a new echo stream of s and checks they come back.
func echoCheck(ctx context.Context, s *Session, size int) error {
	c, err := s.Open(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	data := make([]byte, size)
	rand.Read(data)
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(append([]byte{'e'}, data...))
		werr <- err
	}()
	got := make([]byte, size)
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read echo: %w", err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !bytes.Equal(got, data) {
		return errors.New("echo differs")
	}
	return nil
}

func TestDocComments(t *testing.T) { doccheck.Exported(t, ".") }

func TestManyConcurrentStreams(t *testing.T) {
	dir := sockDir(t)
	f := newFakeChardev(t, filepath.Join(dir, "ctl.sock"))
	startGuest(t, f.openPort, serveTest)
	ctx := testCtx(t, 30*time.Second)
	s, err := Connect(ctx, f.path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := echoCheck(ctx, s, 10<<10+i*7919); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestReconnectAfterStaleBytes breaks the link while the guest is blocked writing to the port: the
// bytes it had queued reach the next host ahead of the ACK, and the new session works.
func TestReconnectAfterStaleBytes(t *testing.T) {
	dir := sockDir(t)
	f := newFakeChardev(t, filepath.Join(dir, "ctl.sock"))
	startGuest(t, f.openPort, serveTest)
	ctx := testCtx(t, 30*time.Second)
	s1, err := Connect(ctx, f.path)
	if err != nil {
		t.Fatal(err)
	}
	flood, err := s1.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	flood.Write([]byte{'f'})
	if _, err := io.ReadFull(flood, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, flood) // keeps the stream's window open
	// The host stops reading the port: the guest's queue fills and its writer blocks.
	f.setHold(true)
	// Bytes waiting in the queue are what the next host gets as stale bytes. How many depends on
	// how much yamux window the guest had left when the host stopped reading (a loaded machine
	// may lag with window updates), so wait for some, then for the queue to stop growing.
	waitFor(t, "bytes in the guest's queue", func() bool { return f.queued() > 0 })
	for last := -1; f.queued() != last; {
		last = f.queued()
		time.Sleep(50 * time.Millisecond)
	}
	s1.Close()
	select {
	case <-s1.Done():
	case <-ctx.Done():
		t.Fatal("Done not closed")
	}
	f.setHold(false)

	s2, err := Connect(ctx, f.path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got := f.staleDelivered(); got == 0 {
		t.Errorf("no stale bytes reached the second host: the test did not test them")
	}
	for range 4 {
		if err := echoCheck(ctx, s2, 300<<10); err != nil {
			t.Fatal(err)
		}
	}
}

// TestResyncWithoutDisconnect: a new host arrives without the guest ever seeing the old one leave
// (as after a restore); its SYNC, read by the guest's old session, is answered at once rather
// than after the host's first attempt times out.
func TestResyncWithoutDisconnect(t *testing.T) {
	dir := sockDir(t)
	f := newFakeChardev(t, filepath.Join(dir, "ctl.sock"))
	f.setQuietDisconnect(true)
	startGuest(t, f.openPort, serveTest)
	ctx := testCtx(t, 30*time.Second)
	for i := range 3 {
		s, err := Connect(ctx, f.path)
		if err != nil {
			t.Fatal(err)
		}
		if err := echoCheck(ctx, s, 100<<10); err != nil {
			t.Fatal(err)
		}
		f.restart()
		<-s.Done()
		start := time.Now()
		s2, err := Connect(ctx, f.path)
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d >= firstAttempt {
			t.Errorf("round %d: reconnect took %v: the SYNC was not answered from the old session's tail", i, d)
		}
		if err := echoCheck(ctx, s2, 100<<10); err != nil {
			t.Fatal(err)
		}
		s2.Close()
	}
}

// noDeadlines hides the fake port's deadlines: the guest must close and reopen it instead.
type noDeadlines struct{ io.ReadWriteCloser }

func TestReconnectPortWithoutDeadlines(t *testing.T) {
	dir := sockDir(t)
	f := newFakeChardev(t, filepath.Join(dir, "ctl.sock"))
	startGuest(t, func() (io.ReadWriteCloser, error) {
		p, err := f.openPort()
		if err != nil {
			return nil, err
		}
		return noDeadlines{p}, nil
	}, serveTest)
	ctx := testCtx(t, 30*time.Second)
	for range 3 {
		s, err := Connect(ctx, f.path)
		if err != nil {
			t.Fatal(err)
		}
		if err := echoCheck(ctx, s, 100<<10); err != nil {
			t.Fatal(err)
		}
		s.Close()
		<-s.Done()
	}
}

// TestConnectWaitsForGuest: the host connects before the guest listens (the VM still boots).
func TestConnectWaitsForGuest(t *testing.T) {
	dir := sockDir(t)
	f := newFakeChardev(t, filepath.Join(dir, "ctl.sock"))
	ctx := testCtx(t, 30*time.Second)
	type res struct {
		s   *Session
		err error
	}
	ch := make(chan res, 1)
	go func() {
		s, err := Connect(ctx, f.path)
		ch <- res{s, err}
	}()
	time.Sleep(1500 * time.Millisecond) // past the first handshake attempt: the test's point
	startGuest(t, f.openPort, serveTest)
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.s.Close()
	if err := echoCheck(ctx, r.s, 1000); err != nil {
		t.Fatal(err)
	}
}

func TestConnectCanceled(t *testing.T) {
	dir := sockDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := Connect(ctx, filepath.Join(dir, "nothing.sock"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Connect to nothing: %v, want a deadline error", err)
	}
	// A socket that accepts but never answers.
	f := newFakeChardev(t, filepath.Join(dir, "ctl.sock"))
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	start := time.Now()
	if _, err := Connect(ctx2, f.path); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Connect to a silent guest: %v, want a deadline error", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Connect returned %v after its deadline", d)
	}
}

// TestHandshakeJunkLimit: a peer that never answers but talks endlessly is given up on.
func TestHandshakeJunkLimit(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		bufio.NewReader(b).ReadString('\n')
		junk := bytes.Repeat([]byte("CORRAL-ACK 0123\n"), 4096)
		for {
			if _, err := b.Write(junk); err != nil {
				return
			}
		}
	}()
	_, err := handshakeHost(context.Background(), a, time.Now().Add(10*time.Second))
	if !errors.Is(err, errTooMuchJunk) {
		t.Fatalf("handshake: %v, want errTooMuchJunk", err)
	}
}

func TestReadSync(t *testing.T) {
	nonce := strings.Repeat("0123456789abcdef", 2)
	for _, tt := range []struct {
		in   string
		want string // "" for EOF
	}{
		{"CORRAL-SYNC " + nonce + "\n", nonce},
		{"junk\x00\xffCORRAL-SYNC " + nonce + "\nmore", nonce},
		{"CORRAL-SYNCORRAL-SYNC " + nonce + "\n", nonce},
		{"CORRAL-SYNC CORRAL-SYNC " + nonce + "\n", nonce},
		{"CORRAL-SYNC " + nonce[:31] + "\n", ""},
		{"CORRAL-SYNC " + nonce + "0\n", ""},
		{"CORRAL-SYNC " + strings.ToUpper(nonce) + "\n", ""},
		{"CORRAL-SYNC " + nonce, ""},
		{"CORRAL-SYNC " + nonce[:10] + "CORRAL-SYNC " + nonce + "\n", nonce},
	} {
		got, err := readSync(bufio.NewReader(strings.NewReader(tt.in)))
		if tt.want == "" {
			if err != io.EOF {
				t.Errorf("readSync(%q) = %q, %v; want EOF", tt.in, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("readSync(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func FuzzReadSync(f *testing.F) {
	f.Add([]byte("CORRAL-SYNC 0123456789abcdef0123456789abcdef\n"))
	f.Add([]byte("CORRAL-SYNCORRAL-SYNC 0123456789abcdef0123456789abcdef\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		nonce, err := readSync(bufio.NewReader(bytes.NewReader(in)))
		if err != nil {
			return
		}
		line := syncPrefix + nonce + "\n"
		if len(nonce) != nonceLen || !bytes.Contains(in, []byte(line)) {
			t.Fatalf("readSync found %q, which is not a SYNC line of the input", nonce)
		}
	})
}

func TestAwaitLine(t *testing.T) {
	line := []byte("CORRAL-ACK abc\n")
	for _, tt := range []struct {
		in string
		ok bool
	}{
		{"CORRAL-ACK abc\n", true},
		{"\n\nCORRAL-ACK CORRAL-ACK abc\nrest", true},
		{"CORRAL-ACK abd\n", false},
		{"CORRAL-ACK abc", false},
	} {
		err := awaitLine(bufio.NewReader(strings.NewReader(tt.in)), line, 1<<10)
		if (err == nil) != tt.ok {
			t.Errorf("awaitLine(%q) = %v, want ok=%v", tt.in, err, tt.ok)
		}
	}
}

func TestTailSyncLine(t *testing.T) {
	nonce := strings.Repeat("ab", 16)
	tr := &tailReader{r: strings.NewReader(strings.Repeat("x", 1000) + "CORRAL-SYNC " + nonce + "\n")}
	io.Copy(io.Discard, tr)
	got, err := readSync(&byteReader{pending: tr.syncLine(), r: bufio.NewReader(strings.NewReader(""))})
	if err != nil || got != nonce {
		t.Fatalf("sync from tail: %q, %v", got, err)
	}
	tr = &tailReader{r: strings.NewReader(strings.Repeat("x", 1000))}
	io.Copy(io.Discard, tr)
	if l := tr.syncLine(); l != nil {
		t.Fatalf("syncLine of junk = %q", l)
	}
}

// TestListenerClose: Accept returns net.ErrClosed after Close, also while a session is up.
func TestListenerClose(t *testing.T) {
	dir := sockDir(t)
	f := newFakeChardev(t, filepath.Join(dir, "ctl.sock"))
	ln := Listen(f.openPort, nil)
	ctx := testCtx(t, 10*time.Second)
	s, err := Connect(ctx, f.path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := s.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	g, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		done <- err
	}()
	ln.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
	if _, err := g.Read(make([]byte, 1)); err == nil {
		t.Fatal("a stream of the closed listener still reads")
	}
	// The host notices only when its keepalive fails: virtio-serial does not tell QEMU's
	// client that the guest closed the port.
	c.Close()
}

// startAgent serves a real agent on a guest listener until the test ends.
func startAgent(t *testing.T, ln net.Listener) {
	srv, err := agentrpc.NewServer(agentrpc.Config{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

// drain reads a command's events to the end and returns its output and exit.
func drain(next func() (agentrpc.Event, error)) (string, *agentrpc.Exit, error) {
	var out strings.Builder
	for {
		ev, err := next()
		if err == io.EOF {
			return out.String(), nil, nil
		}
		if err != nil {
			return out.String(), nil, err
		}
		switch ev.Type {
		case agentrpc.EventStdout, agentrpc.EventStderr:
			out.Write(ev.Data)
		case agentrpc.EventExit:
			return out.String(), ev.Exit, nil
		}
	}
}

// TestProxyAgent drives a real agent through a Proxy, across a new QEMU process (a resume): an
// exec stream that was open when the link broke fails, and the command, still running in the
// guest, is re-attached through the new link.
func TestProxyAgent(t *testing.T) {
	dir := sockDir(t)
	f := newFakeChardev(t, filepath.Join(dir, "ctl.sock"))
	startAgent(t, Listen(f.openPort, testLog(t)))
	p, err := NewProxy(filepath.Join(dir, "agent.sock"), f.path, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if fi, err := os.Stat(filepath.Join(dir, "agent.sock")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("agent socket: %v, %v", fi, err)
	}
	cl := agentrpc.NewClient(filepath.Join(dir, "agent.sock"))
	ctx := testCtx(t, 60*time.Second)
	if _, err := cl.Ping(ctx); err != nil {
		t.Fatal(err)
	}

	// Many calls at once.
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sess, err := cl.Exec(ctx, agentrpc.ExecRequest{Argv: []string{fmt.Sprintf("echo %d", i)}, Shell: true})
			if err != nil {
				t.Error(err)
				return
			}
			defer sess.Close()
			out, exit, err := drain(sess.Next)
			if err != nil || exit == nil || exit.Code != 0 || out != fmt.Sprintf("%d\n", i) {
				t.Errorf("exec %d: %q, %+v, %v", i, out, exit, err)
			}
		}()
	}
	wg.Wait()

	sess, err := cl.Exec(ctx, agentrpc.ExecRequest{Argv: []string{"echo one; sleep 1.5; echo two"}, Shell: true})
	if err != nil {
		t.Fatal(err)
	}
	id := sess.Info().ID
	ev, err := sess.Next()
	if err != nil || string(ev.Data) != "one\n" {
		t.Fatalf("first event: %+v, %v", ev, err)
	}

	f.restart() // the VM resumes in a new QEMU process
	_, _, err = drain(sess.Next)
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("exec stream across the break: %v, want unavailable", err)
	}
	sess.Close()

	st, err := cl.Attach(ctx, id, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	out, exit, err := drain(st.Next)
	if err != nil || exit == nil || exit.Code != 0 || out != "one\ntwo\n" {
		t.Fatalf("re-attached: %q, %+v, %v", out, exit, err)
	}

	// The QEMU process goes away for good: calls fail at once.
	f.stop()
	start := time.Now()
	if _, err := cl.Ping(ctx); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("ping without a VM: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("ping without a VM took %v", d)
	}
}

// TestProxyRefusesWithoutVM: with nothing at the chardev path, a call fails at once.
func TestProxyRefusesWithoutVM(t *testing.T) {
	dir := sockDir(t)
	p, err := NewProxy(filepath.Join(dir, "agent.sock"), filepath.Join(dir, "ctl.sock"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cl := agentrpc.NewClient(filepath.Join(dir, "agent.sock"))
	ctx := testCtx(t, 10*time.Second)
	for range 3 {
		start := time.Now()
		_, err := cl.Ping(ctx)
		if !errors.Is(err, errdefs.ErrUnavailable) {
			t.Fatalf("ping: %v, want unavailable", err)
		}
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Errorf("ping took %v", d)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "agent.sock")); !os.IsNotExist(err) {
		t.Errorf("socket left after Close: %v", err)
	}
}

// TestProxyCloseWhileConnecting: Close does not wait for a connect to a guest that never answers.
func TestProxyCloseWhileConnecting(t *testing.T) {
	dir := sockDir(t)
	f := newFakeChardev(t, filepath.Join(dir, "ctl.sock"))
	p, err := StartProxy(ProxyConfig{ListenPath: filepath.Join(dir, "agent.sock"), ChardevPath: f.path, ConnectTimeout: time.Minute}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl := agentrpc.NewClient(filepath.Join(dir, "agent.sock"))
	done := make(chan error, 1)
	go func() {
		_, err := cl.Ping(context.Background())
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // the ping is waiting for the connect
	start := time.Now()
	p.Close()
	if err := <-done; !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("ping: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v", d)
	}
}

// TestOpenDevicePollable: a character device that implements poll (here a pseudo-terminal) opens
// with deadlines, and a blocked read is released by a deadline and by Close.
func TestOpenDevicePollable(t *testing.T) {
	f, err := OpenDevice("/dev/ptmx")
	if err != nil {
		t.Skip("no /dev/ptmx:", err)
	}
	defer f.Close()
	if err := f.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatalf("deadline: %v", err)
	}
	if _, err := f.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v", err)
	}
	f.SetReadDeadline(time.Time{})
	done := make(chan error, 1)
	go func() {
		_, err := f.Read(make([]byte, 1))
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	f.Close()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("read after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not release a blocked read")
	}
}

func TestFindPort(t *testing.T) {
	dir := t.TempDir()
	for name, port := range map[string]string{"vport1p1": "org.qemu.guest_agent.0", "vport3p1": "corral.ctl", "vport3p2": ""} {
		os.MkdirAll(filepath.Join(dir, name), 0o755)
		os.WriteFile(filepath.Join(dir, name, "name"), []byte(port+"\n"), 0o644)
	}
	got, err := findPort(dir, "corral.ctl")
	if err != nil || got != "vport3p1" {
		t.Fatalf("findPort: %q, %v", got, err)
	}
	if _, err := findPort(dir, "other"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("findPort of a missing port: %v", err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // CI runs this beside the e2e tests on 2 CPUs
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
