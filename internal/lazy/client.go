//go:build linux

package lazy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// maxLogBytes is the size past which a starting lazyd's log is moved aside to lazyd.log.1.
const maxLogBytes = 64 << 20

// StartOptions say how to reach, or start, the lazyd of a directory.
type StartOptions struct {
	Dir string
	// BlobStore is the blob store's String(): a running lazyd serving another store is refused.
	BlobStore string
	// Command starts a lazyd for Dir (the corral binary's hidden `lazyd` subcommand with its
	// flags). It runs in a session of its own, so it outlives the caller. Nil: the caller runs
	// Run itself; Start only waits for it to answer.
	Command []string
	// NoStart only connects to a lazyd already serving Dir: Start fails at once (wrapping
	// errdefs.ErrUnavailable) when none answers.
	NoStart bool
	Log     *slog.Logger
}

// Client talks to a lazyd over its socket and, while open, holds it: the server does not exit
// while a client holds it or a layer is mounted through it.
type Client struct {
	dir  string
	hc   *http.Client
	info Info

	mu       sync.Mutex
	stopHold context.CancelFunc
	dead     atomic.Bool
	// held is set once hold succeeded: only then does a failed call mean the server died
	// (before, Start is still waiting for it to listen).
	held atomic.Bool
}

// Dead reports whether the client no longer holds its server (it exited, or Close was called):
// a new Start is needed.
func (c *Client) Dead() bool { return c.dead.Load() }

// Start connects to the lazyd serving o.Dir, starting one when none answers, and holds it.
func Start(ctx context.Context, o StartOptions) (*Client, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	sock := filepath.Join(o.Dir, SocketName)
	c := newClient(o.Dir)
	info, err := c.Info(ctx)
	if err != nil && o.NoStart {
		return nil, fmt.Errorf("no lazyd serves %s: %v: %w", o.Dir, err, errdefs.ErrUnavailable)
	}
	if err != nil && o.Command == nil {
		// Served inside this process: wait for it to listen.
		for deadline := time.Now().Add(15 * time.Second); err != nil && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
			info, err = c.Info(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("lazyd in this process did not answer on %s: %w", sock, err)
		}
	}
	if err != nil {
		if err := os.MkdirAll(o.Dir, 0o700); err != nil {
			return nil, err
		}
		logPath := filepath.Join(o.Dir, "lazyd.log")
		if fi, err := os.Stat(logPath); err == nil && fi.Size() > maxLogBytes {
			os.Rename(logPath, logPath+".1") // one old log is kept
		}
		lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(o.Command[0], o.Command[1:]...)
		cmd.Stdout, cmd.Stderr = lf, lf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		err = cmd.Start()
		lf.Close()
		if err != nil {
			return nil, fmt.Errorf("start lazyd: %w", err)
		}
		o.Log.Info("started lazyd", "pid", cmd.Process.Pid, "dir", o.Dir, "log", logPath)
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		deadline := time.Now().Add(15 * time.Second)
	wait:
		for {
			if info, err = c.Info(ctx); err == nil {
				break
			}
			select {
			case werr := <-exited:
				// Another process may have started one first: it then holds the lock.
				if info, err = c.Info(ctx); err == nil {
					break wait
				}
				return nil, fmt.Errorf("lazyd exited (%v) without serving; its log %s ends: %s: %w", werr, logPath, logTail(logPath), errdefs.ErrUnavailable)
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("lazyd did not answer on %s within 15 s; its log %s ends: %s: %w", sock, logPath, logTail(logPath), errdefs.ErrUnavailable)
			}
		}
	}
	if info.Protocol != ProtocolVersion {
		return nil, fmt.Errorf("the lazyd serving %s (pid %d) speaks protocol %d, this Corral %d: stop it once no sandbox runs: %w", o.Dir, info.Pid, info.Protocol, ProtocolVersion, errdefs.ErrConflict)
	}
	if info.BlobStore != o.BlobStore {
		return nil, fmt.Errorf("the lazyd serving %s (pid %d) reads blob store %s, not %s: %w", o.Dir, info.Pid, info.BlobStore, o.BlobStore, errdefs.ErrConflict)
	}
	c.info = info
	if err := c.hold(); err != nil {
		return nil, err
	}
	return c, nil
}

// newClient returns a client of the lazyd serving dir, holding nothing yet.
func newClient(dir string) *Client {
	sock := filepath.Join(dir, SocketName)
	return &Client{dir: dir, hc: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		MaxIdleConnsPerHost: 16,
	}}}
}

// StartRetrying is Start, tried again (up to 3 times, a short pause between) when the server it
// reached was exiting: the next attempt finds it gone and starts a new one.
func StartRetrying(ctx context.Context, o StartOptions) (*Client, error) {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var c *Client
		if c, err = Start(ctx, o); err == nil || !errors.Is(err, errExiting) {
			return c, err
		}
		select {
		case <-time.After(300 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return nil, err
}

// errExiting marks a hold the server refused because it is exiting.
var errExiting = errors.New("lazyd is exiting")

// MountDir is the FUSE mount holding <name>.blob files.
func (c *Client) MountDir() string { return c.info.Mount }

// TablePath is where the chunk table of layer name must be written before its blob is opened.
func (c *Client) TablePath(name string) string { return filepath.Join(c.dir, tablesDir, name+".json") }

// BlobPath is the blob file of layer name.
func (c *Client) BlobPath(name string) string { return filepath.Join(c.info.Mount, name+".blob") }

// hold keeps one request open for the client's life.
func (c *Client) hold() error {
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://lazyd/v1/hold", nil)
	resp, err := c.hc.Do(req)
	if err != nil {
		cancel()
		return fmt.Errorf("hold lazyd: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		return fmt.Errorf("hold lazyd: HTTP %d: %w", resp.StatusCode, errExiting)
	}
	go func() {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		c.dead.Store(true) // the server went, or Close let go
	}()
	c.mu.Lock()
	c.stopHold = cancel
	c.mu.Unlock()
	c.held.Store(true)
	return nil
}

// Drop lets go of a server found dead without asking it to exit (unlike Close: another lazyd may
// already serve the directory).
func (c *Client) Drop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopHold != nil {
		c.stopHold()
		c.stopHold = nil
	}
	c.hc.CloseIdleConnections()
}

// Close lets go of the server and asks it to exit once nothing uses it. When no layer is
// mounted through it, Close waits (up to 5 s) for it to have exited and unmounted.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopHold == nil {
		return
	}
	c.stopHold()
	c.stopHold = nil
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var r exitReply
	if err := c.do(ctx, http.MethodPost, "/v1/exit", nil, &r); err == nil && r.Open == 0 {
		for ctx.Err() == nil {
			if _, err := c.Info(ctx); err != nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	c.hc.CloseIdleConnections()
}

// Info asks the server who it is.
func (c *Client) Info(ctx context.Context) (Info, error) {
	var info Info
	err := c.do(ctx, http.MethodGet, "/v1/info", nil, &info)
	return info, err
}

// Register starts a sandbox's fetching (see SandboxRequest). In eager mode it returns once every
// chunk is cached.
func (c *Client) Register(ctx context.Context, req SandboxRequest) error {
	return c.do(ctx, http.MethodPost, "/v1/sandboxes", req, nil)
}

// Unregister ends a sandbox's fetching and returns its statistics.
func (c *Client) Unregister(ctx context.Context, id string) (Stats, error) {
	var st Stats
	err := c.do(ctx, http.MethodDelete, "/v1/sandboxes/"+id, nil, &st)
	return st, err
}

// SandboxStats returns a registered sandbox's statistics.
func (c *Client) SandboxStats(ctx context.Context, id string) (Stats, error) {
	var st Stats
	err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+id, nil, &st)
	return st, err
}

// LayerStats returns a layer's statistics.
func (c *Client) LayerStats(ctx context.Context, name string) (Stats, error) {
	var st Stats
	err := c.do(ctx, http.MethodGet, "/v1/layers/"+name, nil, &st)
	return st, err
}

// AllLayerStats returns the statistics of every layer the server has served, by name.
func (c *Client) AllLayerStats(ctx context.Context) ([]Stats, error) {
	var st []Stats
	err := c.do(ctx, http.MethodGet, "/v1/layers", nil, &st)
	return st, err
}

// CacheStats describes the chunk cache.
func (c *Client) CacheStats(ctx context.Context) (CacheStats, error) {
	var st CacheStats
	err := c.do(ctx, http.MethodGet, "/v1/cache", nil, &st)
	return st, err
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://lazyd"+path, rd)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() == nil && c.held.Load() {
			// The server this client held is not there any more (it died; its socket refuses
			// or resets): the next lazyClient starts another rather than handing this one out.
			c.dead.Store(true)
		}
		return fmt.Errorf("lazyd %s %s: %v: %w", method, path, err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return fmt.Errorf("lazyd %s %s: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e errorBody
		json.Unmarshal(b, &e)
		if e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
		}
		// The server's message ends with its error's kind already ("...: resource exhausted").
		kinded := func(kind error) error {
			return fmt.Errorf("%s: %w", strings.TrimSuffix(e.Error, ": "+kind.Error()), kind)
		}
		switch e.Kind {
		case "invalid":
			return kinded(errdefs.ErrInvalid)
		case "not_found":
			return kinded(errdefs.ErrNotFound)
		case "unavailable":
			return kinded(errdefs.ErrUnavailable)
		case "exhausted":
			return kinded(errdefs.ErrExhausted)
		}
		return fmt.Errorf("lazyd: %s (HTTP %d)", e.Error, resp.StatusCode)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

func logTail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "(empty)"
	}
	return s
}
