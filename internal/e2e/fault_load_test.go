package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// The fault suite (issue 30 item 5): each TestFault* case runs faultLoad against a Corral, injects
// one fault while it runs, and checks what the load saw. faultLoad is what an agent platform does
// to Corral, scaled for a 2-core CI machine: a few workers, each creating small runc sandboxes,
// running commands whose output it checks, writing files whose checksums it keeps, and deleting
// sandboxes, with the SDK's ordinary retries.
//
// What it asserts afterwards (verify):
//   - no sandbox lost: every create that was acknowledged, and not deleted since, is running;
//   - no acknowledged data lost: every file write answered 200 reads back with its checksum, and
//     every exec answered with its exit is in the sandbox's trajectory under its step ID;
//   - every failure was a clear retryable one: a 503 with Retry-After, or (inside a window the
//     case declares with expect) a connection error or a client timeout. Anything else, a 500 or a
//     503 without Retry-After seen on the wire included, is reported with the request.

// faultLoad drives load against one Corral (or a cluster's replicas).
type faultLoad struct {
	t       *testing.T
	clients []*corral.Client
	workers int
	// opTimeout bounds each call, so a stalled control plane shows up as timeouts.
	opTimeout time.Duration

	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu protects everything below.
	mu    sync.Mutex
	stats map[string]*opStats
	// sandboxes holds every sandbox whose create was acknowledged.
	sandboxes map[string]*loadSandbox
	// windows are the spans in which the case allows connection errors and client timeouts.
	windows []faultWindow
	// unclear lists failures that are neither success nor a clear retryable error.
	unclear []string
	// wire counts responses seen on the wire (including those the SDK retried), by class.
	wire map[string]int
}

// opStats counts one kind of request.
type opStats struct {
	Tried, Failed int
	// ByClass counts the failures by class: "503+retry-after", "connection", "timeout", or the
	// unclear ones' status and code.
	ByClass map[string]int
}

// loadSandbox is what the load knows of one of its sandboxes.
type loadSandbox struct {
	id     string
	client *corral.Client
	// files maps each acknowledged write's path to the sha256 of what was written.
	files map[string][32]byte
	// steps holds the step IDs of acknowledged execs.
	steps []string
	// deleting is set once a delete was sent (its outcome may be unknown).
	deleting bool
}

// faultWindow is a span in which connection errors ("kill") or also timeouts ("stall") are
// expected.
type faultWindow struct {
	from, to time.Time
	stall    bool
}

// newFaultLoad prepares load against the servers at urls, with token (worker i uses
// urls[i%len]); start starts it, stop ends it.
func newFaultLoad(t *testing.T, token string, urls ...string) *faultLoad {
	t.Helper()
	l := &faultLoad{t: t, workers: 3, opTimeout: 20 * time.Second,
		stats: map[string]*opStats{}, sandboxes: map[string]*loadSandbox{}, wire: map[string]int{}}
	// The load's own clients: the same servers and tokens, with a transport that sees every
	// answer (the SDK's retries hide the first ones).
	hc := &http.Client{Transport: &wireRecorder{l: l, rt: http.DefaultTransport.(*http.Transport).Clone()}}
	for _, u := range urls {
		l.clients = append(l.clients, corral.New(u, token, corral.WithHTTPClient(hc)))
	}
	return l
}

// start starts the workers.
func (l *faultLoad) start() *faultLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	for w := range l.workers {
		l.wg.Go(func() { l.work(ctx, w) })
	}
	return l
}

// wireRecorder counts every answer Corral gives, before the SDK decides to retry it.
type wireRecorder struct {
	l  *faultLoad
	rt http.RoundTripper
}

func (w *wireRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := w.rt.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	class := strconv.Itoa(resp.StatusCode / 100 * 100)
	if resp.StatusCode >= 500 {
		class = strconv.Itoa(resp.StatusCode)
		if resp.Header.Get("Retry-After") != "" {
			class += "+retry-after"
		}
	}
	w.l.mu.Lock()
	w.l.wire[class]++
	if resp.StatusCode >= 500 && !strings.HasSuffix(class, "+retry-after") {
		// A server error, or a 503 that does not say when to come back: not a clear retryable
		// error. The body says which.
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		w.l.unclear = append(w.l.unclear, fmt.Sprintf("%s %s answered %d without Retry-After: %s", req.Method, req.URL.Path, resp.StatusCode, strings.TrimSpace(string(body))))
	}
	w.l.mu.Unlock()
	return resp, err
}

// expect declares that from now until end() connection errors (and, with stall, client timeouts)
// are part of the fault.
func (l *faultLoad) expect(stall bool) (end func()) {
	l.mu.Lock()
	l.windows = append(l.windows, faultWindow{from: time.Now(), stall: stall})
	i := len(l.windows) - 1
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		l.windows[i].to = time.Now()
		l.mu.Unlock()
	}
}

// stop ends the workers and waits for them.
func (l *faultLoad) stop() {
	l.cancel()
	l.wg.Wait()
}

func randIntn(n int) int {
	v, _ := rand.Int(rand.Reader, big.NewInt(int64(n)))
	return int(v.Int64())
}

// work is one worker: it keeps up to two sandboxes of its own and, on them, runs commands,
// writes files and sometimes deletes one.
func (l *faultLoad) work(ctx context.Context, w int) {
	c := l.clients[w%len(l.clients)]
	var mine []*loadSandbox
	for n := 0; ctx.Err() == nil; n++ {
		if len(mine) < 2 {
			if sb := l.create(ctx, c, w, n); sb != nil {
				mine = append(mine, sb)
			}
			continue
		}
		sb := mine[randIntn(len(mine))]
		switch r := randIntn(10); {
		case r < 5:
			l.exec(ctx, sb, w, n)
		case r < 9:
			l.write(ctx, sb, n)
		default:
			l.delete(ctx, sb)
			mine = slices.DeleteFunc(mine, func(x *loadSandbox) bool { return x == sb })
		}
	}
}

// do runs one call of kind with the load's timeout and records its outcome.
func (l *faultLoad) do(ctx context.Context, kind string, call func(ctx context.Context) error) bool {
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, l.opTimeout)
	err := call(cctx)
	cancel()
	if ctx.Err() != nil {
		return false // the load stopped: not counted
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.stats[kind]
	if st == nil {
		st = &opStats{ByClass: map[string]int{}}
		l.stats[kind] = st
	}
	st.Tried++
	if err == nil {
		return true
	}
	st.Failed++
	class := l.classLocked(err, start)
	st.ByClass[class]++
	if !clearClass(class) {
		l.unclear = append(l.unclear, fmt.Sprintf("%s at %s: %s: %v", kind, start.Format("15:04:05.000"), class, err))
	}
	return false
}

// classLocked names the class of a failed call that started at start.
func (l *faultLoad) classLocked(err error, start time.Time) string {
	inWindow := func(stall bool) bool {
		end := time.Now()
		for _, w := range l.windows {
			// A call that overlapped the window (one that was in flight when it opened
			// included).
			if (w.to.IsZero() || !start.After(w.to.Add(time.Second))) && !end.Before(w.from) && (w.stall || !stall) {
				return true
			}
		}
		return false
	}
	var apiErr *corral.APIError
	switch {
	case errors.As(err, &apiErr) && apiErr.Status == http.StatusServiceUnavailable:
		// Whether it said when to come back, the wire recorder checked.
		return "503+retry-after"
	case errors.As(err, &apiErr):
		return fmt.Sprintf("%d %s (unclear)", apiErr.Status, apiErr.Code)
	case errors.Is(err, context.DeadlineExceeded):
		if inWindow(true) {
			return "timeout"
		}
		return "timeout outside a fault (unclear)"
	case connectionError(err):
		if inWindow(false) {
			return "connection"
		}
		return "connection outside a fault (unclear)"
	}
	return "other (unclear)"
}

func clearClass(class string) bool { return !strings.HasSuffix(class, "(unclear)") }

// connectionError reports whether err is a broken or refused connection (or a stream cut short).
func connectionError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || strings.Contains(err.Error(), "connection reset") ||
		strings.Contains(err.Error(), "unexpected EOF") || strings.Contains(err.Error(), "server closed")
}

// faultLimits keeps the load's sandboxes small: what is under test is what survives, not size.
var faultLimits = corral.Limits{CPUs: 0.1, MemoryBytes: 64 << 20}

func (l *faultLoad) create(ctx context.Context, c *corral.Client, w, n int) *loadSandbox {
	var sb *corral.Sandbox
	key := fmt.Sprintf("fault-%d-%d-%s", w, n, randHex(4))
	ok := l.do(ctx, "create", func(ctx context.Context) (err error) {
		sb, err = c.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Limits: faultLimits, IdempotencyKey: key})
		if err == nil && sb.State != corral.StateRunning {
			err = fmt.Errorf("created sandbox %s is %s", sb.ID, sb.State)
		}
		return err
	})
	if !ok {
		return nil
	}
	lsb := &loadSandbox{id: sb.ID, client: c, files: map[string][32]byte{}}
	l.mu.Lock()
	l.sandboxes[sb.ID] = lsb
	l.mu.Unlock()
	return lsb
}

func (l *faultLoad) exec(ctx context.Context, sb *loadSandbox, w, n int) {
	step := fmt.Sprintf("s%d-%d", w, n)
	token := randHex(6)
	if l.do(ctx, "exec", func(ctx context.Context) error {
		out, _, exit, err := sb.client.Run(ctx, sb.id, corral.ExecRequest{Argv: []string{"sh", "-c", `echo "$0"; seq 1 300`, token}, StepID: step})
		if err != nil {
			return err
		}
		if exit.Code != 0 || !strings.HasPrefix(string(out), token+"\n1\n") || !strings.HasSuffix(string(out), "\n300\n") {
			return fmt.Errorf("exec in %s: exit %d, output %d bytes starting %.40q", sb.id, exit.Code, len(out), out)
		}
		return nil
	}) {
		l.mu.Lock()
		sb.steps = append(sb.steps, step)
		l.mu.Unlock()
	}
}

func (l *faultLoad) write(ctx context.Context, sb *loadSandbox, n int) {
	data := make([]byte, 4<<10+randIntn(60<<10))
	rand.Read(data)
	path := fmt.Sprintf("/root/f%d", n)
	if l.do(ctx, "write", func(ctx context.Context) error {
		_, err := sb.client.WriteFile(ctx, sb.id, path, bytes.NewReader(data), corral.WriteFileOptions{})
		return err
	}) {
		l.mu.Lock()
		sb.files[path] = sha256.Sum256(data)
		l.mu.Unlock()
	}
}

func (l *faultLoad) delete(ctx context.Context, sb *loadSandbox) {
	l.mu.Lock()
	sb.deleting = true
	l.mu.Unlock()
	l.do(ctx, "delete", func(ctx context.Context) error {
		_, err := sb.client.DeleteSandbox(ctx, sb.id)
		return err
	})
}

// faultReport is what verify found.
type faultReport struct {
	Stats                 map[string]*opStats
	Wire                  map[string]int
	Running, Lost         int // sandboxes that should run, and those of them that do not
	Files, FilesLost      int
	Steps, StepsLost      int
	Unclear               []string
	RecoveredIn, FaultFor time.Duration
}

// verify checks every acknowledged sandbox, write and step through c (any client of the
// Corral), and fails the test for a loss or an unclear failure. Call it after stop.
func (l *faultLoad) verify(c *corral.Client) faultReport {
	t := l.t
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	r := faultReport{Stats: l.stats, Wire: l.wire, Unclear: l.unclear}
	for _, sb := range l.sandboxes {
		got, err := c.GetSandbox(ctx, sb.id)
		if err != nil {
			t.Errorf("get sandbox %s: %v", sb.id, err)
			continue
		}
		if sb.deleting {
			continue
		}
		r.Running++
		if got.State != corral.StateRunning {
			r.Lost++
			t.Errorf("sandbox %s, acknowledged and never deleted, is %s (%s)", sb.id, got.State, got.Reason)
			continue
		}
		for path, sum := range sb.files {
			r.Files++
			rc, err := c.ReadFile(ctx, sb.id, path)
			var b []byte
			if err == nil {
				b, err = io.ReadAll(rc)
				rc.Close()
			}
			if err != nil || sha256.Sum256(b) != sum {
				r.FilesLost++
				t.Errorf("acknowledged write of %s in %s: read back %d bytes, %v; checksum differs", path, sb.id, len(b), err)
			}
		}
		traj, err := c.Trajectory(ctx, sb.id, 0)
		if err != nil {
			t.Errorf("trajectory of %s: %v", sb.id, err)
			continue
		}
		done := map[string]bool{}
		for _, e := range traj {
			if e.Exit != nil && e.Exit.Code == 0 {
				done[e.StepID] = true
			}
		}
		for _, s := range sb.steps {
			r.Steps++
			if !done[s] {
				r.StepsLost++
				t.Errorf("acknowledged exec step %s of %s is not in its trajectory", s, sb.id)
			}
		}
	}
	for _, u := range l.unclear {
		t.Errorf("not a clear retryable failure: %s", u)
	}
	return r
}

// log prints the report as the line docs/RELIABILITY.md quotes.
func (r faultReport) log(t *testing.T, fault string) {
	t.Helper()
	var kinds []string
	for _, k := range []string{"create", "exec", "write", "delete"} {
		if st := r.Stats[k]; st != nil {
			s := fmt.Sprintf("%s %d/%d", k, st.Failed, st.Tried)
			if len(st.ByClass) > 0 {
				s += fmt.Sprintf(" %v", st.ByClass)
			}
			kinds = append(kinds, s)
		}
	}
	t.Logf("FAULT %s: failed/tried: %s; wire: %v; sandboxes lost %d of %d; writes lost %d of %d; steps lost %d of %d; fault lasted %s; service back %s after it",
		fault, strings.Join(kinds, ", "), r.Wire, r.Lost, r.Running, r.FilesLost, r.Files, r.StepsLost, r.Steps, r.FaultFor.Round(time.Millisecond), r.RecoveredIn.Round(time.Millisecond))
}

// waitService polls a create, an exec and a delete through c until all succeed, and returns how
// long that took; it fails the test after within.
func waitService(t *testing.T, c *corral.Client, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	eventually(t, within, "the service back (create, exec, delete)", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		sb, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: "base:test", Limits: faultLimits})
		if err != nil {
			return false
		}
		defer c.DeleteSandbox(context.Background(), sb.ID)
		_, _, exit, err := c.Run(ctx, sb.ID, corral.ExecRequest{Argv: []string{"true"}})
		return err == nil && exit.Code == 0
	})
	return time.Since(start)
}

// runFor lets the load run for d (the load, not a state, is what is waited for).
func runFor(d time.Duration) { time.Sleep(d) }

// procRSS returns the resident set of pid in bytes (0 if it is gone).
func procRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
