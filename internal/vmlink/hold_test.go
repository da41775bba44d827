package vmlink

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/agentrpc"
	"github.com/corral-dev/corral/internal/errdefs"
)

// pipeLink returns a guest port over two pipes (as TakeStdio makes of a gVisor agent's stdin and
// stdout) and the host's ends for Hold.
func pipeLink(t *testing.T) (port *pipePort, fromGuest, toGuest *os.File) {
	toAgentR, toAgentW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	fromAgentR, fromAgentW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, f := range []*os.File{toAgentR, toAgentW, fromAgentR, fromAgentW} {
			f.Close()
		}
	})
	return &pipePort{r: toAgentR, w: fromAgentW}, fromAgentR, toAgentW
}

// startHold serves Hold on a socket at path; the returned channel has its result.
func startHold(t *testing.T, path string, fromGuest io.Reader, toGuest io.Writer) <-chan error {
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Hold(ln, fromGuest, toGuest) }()
	return done
}

// TestHoldProxyAgent drives a real agent over pipes through Hold and a Proxy, as corral does for
// a gVisor sandbox: across a new Proxy (a restart of corral) and a new holder on fresh pipes (a
// restore), a command started before keeps running and is re-attached.
func TestHoldProxyAgent(t *testing.T) {
	dir := sockDir(t)
	ctl := filepath.Join(dir, "ctl.sock")
	first, fromGuest, toGuest := pipeLink(t)
	port := &swapPort{}
	port.cur.Store(first)
	startAgent(t, Listen(func() (io.ReadWriteCloser, error) { return port, nil }, testLog(t)))
	held := startHold(t, ctl, fromGuest, toGuest)

	sock := filepath.Join(dir, "agent.sock")
	p, err := NewProxy(sock, ctl, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	cl := agentrpc.NewClient(sock)
	ctx := testCtx(t, 60*time.Second)
	sess, err := cl.Exec(ctx, agentrpc.ExecRequest{Argv: []string{"echo one; sleep 1; echo two"}, Shell: true})
	if err != nil {
		t.Fatal(err)
	}
	id := sess.Info().ID
	if ev, err := sess.Next(); err != nil || string(ev.Data) != "one\n" {
		t.Fatalf("first event: %+v, %v", ev, err)
	}

	// corral restarts: the old Proxy goes, a new one connects to the same holder.
	p.Close()
	sess.Close()
	if p, err = NewProxy(sock, ctl, testLog(t)); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	st, err := cl.Attach(ctx, id, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	out, exit, err := drain(st.Next)
	st.Close()
	if err != nil || exit == nil || exit.Code != 0 || out != "one\ntwo\n" {
		t.Fatalf("re-attached after a new proxy: %q, %+v, %v", out, exit, err)
	}

	// A restore: the agent's stdin and stdout become fresh pipes (gVisor re-donates them), the
	// old holder sees its pipe end close and returns, a new holder serves the new pipes.
	newPort, newFrom, newTo := pipeLink(t)
	port.cur.Store(newPort) // what the guest's descriptors now refer to
	first.w.Close()         // the old sandbox process is gone
	select {
	case err := <-held:
		if err != nil {
			t.Fatalf("Hold after the agent's end closed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Hold did not return after the agent's end closed")
	}
	if _, err := os.Lstat(ctl); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	os.Remove(ctl)
	// The guest's read of the old pipe must end for it to read the new one (in gVisor the
	// descriptor itself is remapped): the old holder's exit closes its write end.
	toGuest.Close()
	held = startHold(t, ctl, newFrom, newTo)
	waitFor(t, "a ping through the new holder", func() bool { _, err := cl.Ping(ctx); return err == nil })

	// The sandbox ends: calls fail as unavailable, at once.
	newPort.w.Close()
	<-held
	if _, err := cl.Ping(ctx); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("ping after the sandbox ended: %v", err)
	}
}

// TestHoldOneClientAtATime: a second client waits until the first leaves.
func TestHoldOneClientAtATime(t *testing.T) {
	dir := sockDir(t)
	ctl := filepath.Join(dir, "ctl.sock")
	port, fromGuest, toGuest := pipeLink(t)
	startHold(t, ctl, fromGuest, toGuest)
	a, err := net.Dial("unix", ctl)
	if err != nil {
		t.Fatal(err)
	}
	b, err := net.Dial("unix", ctl)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// What the guest reads: a's bytes, then (after a leaves) b's, never b's while a is there.
	guestR := func() string {
		b := make([]byte, 1)
		port.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(port, b); err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	b.Write([]byte("B"))
	a.Write([]byte("A"))
	if got := guestR(); got != "A" {
		t.Fatalf("guest read %q, want A", got)
	}
	a.Close()
	if got := guestR(); got != "B" {
		t.Fatalf("guest read %q, want B", got)
	}
}

// swapPort is a guest port whose pipes a test can replace, as a restore does.
type swapPort struct{ cur atomic.Pointer[pipePort] }

func (p *swapPort) Read(b []byte) (int, error)         { return p.cur.Load().Read(b) }
func (p *swapPort) Write(b []byte) (int, error)        { return p.cur.Load().Write(b) }
func (p *swapPort) Close() error                       { return p.cur.Load().Close() }
func (p *swapPort) SetReadDeadline(t time.Time) error  { return p.cur.Load().SetReadDeadline(t) }
func (p *swapPort) SetWriteDeadline(t time.Time) error { return p.cur.Load().SetWriteDeadline(t) }
