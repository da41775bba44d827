package agentrpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// ClaimableFlag is the serve flag of a microvm's agent in a warm pool (internal/edge/pool.go):
// the guest's PID 1 keeps CAP_SYS_ADMIN, outside every command's bounding set, so that the claim
// can set the sandbox's hostname (Client.SetHostname), after which it drops it.
const ClaimableFlag = "--claimable"

// Config configures a Server. Zero fields take the defaults documented on each.
type Config struct {
	// Env is the sandbox's default environment for commands (KEY=VALUE); default: the agent's own
	// environment, which the container spec sets.
	Env []string
	// EtcDir holds the passwd and group files users are resolved against; default "/etc".
	EtcDir string
	// OutputLimit is the output kept per command when a request does not set one; default 16 MiB.
	OutputLimit int64
	// MaxOutputLimit is the largest OutputLimit a request may ask for; default 1 GiB.
	MaxOutputLimit int64
	// RetainExited and RetainFor bound how long exited commands stay available for Attach and
	// Command: at most RetainExited of them (default 64), each for at most RetainFor (default 10m).
	RetainExited int
	RetainFor    time.Duration
	// RetainOutputBytes bounds the output memory held by exited commands together (the most
	// recent exited command is always kept); default 64 MiB.
	RetainOutputBytes int64
	// ExitGrace is how long output is still read after a command's process exited while something
	// else (a background descendant) keeps its output open; default 1s.
	ExitGrace time.Duration
	// TarInLimit bounds the bytes of file content one TarIn may write; default 4 GiB.
	// TarInEntries bounds its entries; default 1<<20.
	TarInLimit   int64
	TarInEntries int
	// MemoryEvents is the cgroup v2 memory.events file consulted to tell OOM kills from other
	// SIGKILLs; default "/sys/fs/cgroup/memory.events" (missing: OOM kills are not reported).
	MemoryEvents string
	// Version is reported by Ping.
	Version string
	// SetHostname, when set, serves SetHostname once: a microvm's agent started claimable
	// (ClaimableFlag; internal/vmguest.ClaimHostname). Nil: SetHostname is refused.
	SetHostname func(name string) error
	// Calls makes this a calls agent (corral-agent serve --calls, see calls.go): every command
	// must be a call, plain ones are refused. Without it, calls are refused.
	Calls bool
	// SelfExe is the agent's own binary, re-executed as a call's helper; default "/proc/self/exe"
	// (the agent's binary is a sealed memfd that exists nowhere else).
	SelfExe string
	// CallsDir is where calls are prepared; default DefaultCallsDir.
	CallsDir string
	// MaxWatches bounds the watch streams open at once (default 8), MaxWatchDirs the directories
	// one recursive watch covers (default 8192, one inotify watch each), and WatchQueue the events
	// one watch holds for a slow reader before it drops them and reports an overflow (default
	// 1024). See watch.go.
	MaxWatches   int
	MaxWatchDirs int
	WatchQueue   int
	// ForkIdentity applies a ForkIdentity (the forkidentity operation): set by a microvm's
	// agent, whose guest it reconfigures; nil refuses the operation.
	ForkIdentity func(context.Context, ForkIdentity) error
}

func (c *Config) setDefaults() {
	if c.Env == nil {
		c.Env = os.Environ()
	}
	if c.EtcDir == "" {
		c.EtcDir = "/etc"
	}
	if c.OutputLimit == 0 {
		c.OutputLimit = 16 << 20
	}
	if c.MaxOutputLimit == 0 {
		c.MaxOutputLimit = 1 << 30
	}
	if c.RetainExited == 0 {
		c.RetainExited = 64
	}
	if c.RetainFor == 0 {
		c.RetainFor = 10 * time.Minute
	}
	if c.RetainOutputBytes == 0 {
		c.RetainOutputBytes = 64 << 20
	}
	if c.ExitGrace == 0 {
		c.ExitGrace = time.Second
	}
	if c.TarInLimit == 0 {
		c.TarInLimit = 4 << 30
	}
	if c.TarInEntries == 0 {
		c.TarInEntries = 1 << 20
	}
	if c.MemoryEvents == "" {
		c.MemoryEvents = "/sys/fs/cgroup/memory.events"
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	if c.SelfExe == "" {
		c.SelfExe = "/proc/self/exe"
	}
	if c.CallsDir == "" {
		c.CallsDir = DefaultCallsDir
	}
	if c.MaxWatches == 0 {
		c.MaxWatches = 8
	}
	if c.MaxWatchDirs == 0 {
		c.MaxWatchDirs = 8192
	}
	if c.WatchQueue == 0 {
		c.WatchQueue = 1024
	}
}

// Validate reports the first field that is out of range.
func (c *Config) Validate() error {
	switch {
	case c.OutputLimit < 0:
		return errdefs.Invalid("output_limit", "must not be negative")
	case c.MaxOutputLimit < 0 || (c.MaxOutputLimit > 0 && c.OutputLimit > c.MaxOutputLimit):
		return errdefs.Invalid("max_output_limit", "must be at least output_limit")
	case c.RetainExited < 0:
		return errdefs.Invalid("retain_exited", "must not be negative")
	case c.RetainFor < 0:
		return errdefs.Invalid("retain_for", "must not be negative")
	case c.RetainOutputBytes < 0:
		return errdefs.Invalid("retain_output_bytes", "must not be negative")
	case c.ExitGrace < 0:
		return errdefs.Invalid("exit_grace", "must not be negative")
	case c.TarInLimit < 0 || c.TarInEntries < 0:
		return errdefs.Invalid("tar_in_limit", "must not be negative")
	case c.MaxWatches < 0 || c.MaxWatchDirs < 0 || c.WatchQueue < 0:
		return errdefs.Invalid("max_watches", "watch limits must not be negative")
	case c.CallsDir != "" && (!filepath.IsAbs(c.CallsDir) || filepath.Clean(c.CallsDir) != c.CallsDir || c.CallsDir == "/"):
		return errdefs.Invalid("calls_dir", "must be a clean absolute path other than /, got %q", c.CallsDir)
	}
	return nil
}

// Server is the agent side of the protocol: it runs commands and file operations for the
// connections it accepts.
//
// Lock order: exclusiveGate.gate (exclusive.go), then call.mu (calls.go), then Server.mu, then command.mu, then output.mu. The reaper's
// locks are never taken while holding Server.mu, command.mu or output.mu.
type Server struct {
	cfg   Config       // immutable
	log   *slog.Logger // immutable
	users *userDB      // immutable

	mu sync.Mutex
	// Protected by mu:
	cmds     map[string]*command
	exited   []*command // kept exited commands, oldest first
	retained int64      // output memory of exited
	serving  bool
	closing  bool             // Serve is shutting down: no more commands start
	ln       net.Listener     // what Serve accepts on
	calls    map[string]*call // prepared calls by id
	watches  int              // watch streams open

	starting sync.WaitGroup // starts in progress (counted under mu while !closing)

	excl exclusiveGate // the exclusive command, if any (exclusive.go); its fields are protected by mu

	oomMu   sync.Mutex
	oomSeen int64 // protected by oomMu: oom_kill count already attributed

	callsRootMu    sync.Mutex
	callsRootReady bool // protected by callsRootMu: the tmpfs at CallsDir is mounted
	callEnvOnce    sync.Once
	callEnvCache   callEnvironment // written once by callEnvOnce

	helperMu sync.Mutex // a leaf
	// Protected by helperMu:
	idle           []*callHelper // call helpers waiting for a call, most recent last
	helperStarting chan struct{} // closed when the helper being started is ready (or failed); nil when none is
	helpersClosed  bool          // shutting down: no more helpers
	// helperWG counts the goroutine starting a helper (added to under helperMu while
	// !helpersClosed).
	helperWG sync.WaitGroup

	conns sync.WaitGroup
}

// NewServer returns a Server for cfg (zero fields take their defaults). The logger receives
// diagnostics only; the agent passes one that discards them, since it must write nothing inside
// the sandbox.
func NewServer(cfg Config, log *slog.Logger) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg: cfg, log: log, users: &userDB{dir: cfg.EtcDir},
		cmds: make(map[string]*command), calls: make(map[string]*call),
	}
	s.oomSeen = s.readOOMKills()
	return s, nil
}

// Serve accepts connections on ln until ctx ends, then closes ln, kills the commands still
// running (SIGKILL to their process groups), waits for its connections and commands to finish
// and returns nil. It returns early with an error only when ln fails for good. Serve may be called
// once.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	s.mu.Lock()
	if s.serving {
		s.mu.Unlock()
		return errors.New("agentrpc: Serve called twice")
	}
	s.serving = true
	s.ln = ln
	s.mu.Unlock()

	procReaper.acquire()
	defer procReaper.release()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		s.mu.Lock()
		l := s.ln
		s.mu.Unlock()
		l.Close()
	})
	defer stop()

	var err error
	backoff := time.Millisecond
	for {
		conn, aerr := ln.Accept()
		if aerr != nil {
			if ctx.Err() != nil {
				break
			}
			if errors.Is(aerr, net.ErrClosed) || permanentAcceptError(aerr) {
				// Retrying cannot help: the channel is not a listening socket (or is gone).
				err = fmt.Errorf("accept: %w", aerr)
				break
			}
			// EMFILE and the like: the agent must not die (it is PID 1), so wait and retry.
			s.log.Warn("accept", "err", aerr)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = time.Millisecond
		s.conns.Add(1)
		go func() {
			defer s.conns.Done()
			s.serveConn(ctx, conn)
		}()
	}
	cancel()
	s.shutdown()
	s.conns.Wait()
	return err
}

// shutdown stops new commands, kills the running ones and waits (a bounded time) for them to be
// finalized.
func (s *Server) shutdown() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.starting.Wait()
	s.mu.Lock()
	var running []*command
	for _, c := range s.cmds {
		if c.pid != 0 && !c.exited() {
			running = append(running, c)
		}
	}
	for _, c := range s.exited {
		c.mu.Lock()
		c.forgetTimer.Stop()
		c.mu.Unlock()
	}
	s.mu.Unlock()
	s.stopHelpers()
	deadline := time.After(5 * time.Second)
	for _, c := range running {
		c.signal(syscall.SIGKILL)
		select {
		case <-c.done:
		case <-deadline:
			return
		}
	}
}

// conn is one accepted connection. Helpers started for it (stdin readers) are counted in wg and
// end when the connection is closed.
type conn struct {
	nc net.Conn
	f  *framer
	wg sync.WaitGroup
}

// requestTimeout bounds the wait for a connection's request frame.
const requestTimeout = 30 * time.Second

func (s *Server) serveConn(ctx context.Context, nc net.Conn) {
	c := &conn{nc: nc, f: newFramer(nc)}
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer func() {
		stop()
		nc.Close()
		c.wg.Wait()
	}()
	nc.SetReadDeadline(time.Now().Add(requestTimeout))
	typ, payload, err := c.f.readFrame()
	if err != nil {
		return
	}
	nc.SetReadDeadline(time.Time{})
	var req request
	if typ != frameRequest {
		err = fmt.Errorf("first frame is %q, want a request: %w", typ, errdefs.ErrInvalid)
	} else if derr := json.Unmarshal(payload, &req); derr != nil {
		err = errdefs.Invalid("request", "decode: %v", derr)
	} else {
		err = s.dispatch(ctx, c, &req)
	}
	if err != nil {
		err = classify(err)
		if errdefs.Code(err) == "internal" {
			s.log.Debug("request failed", "op", req.Op, "err", err)
		}
		c.f.writeError(err) // fails harmlessly when the client is gone
	}
}

func (s *Server) dispatch(ctx context.Context, c *conn, req *request) error {
	switch req.Op {
	case opRead, opWrite, opStat, opList, opMkdir, opRemove, opTarOut, opTarIn, opMove, opWatch:
		if err := s.checkCallPath(req.Op, req.Path); err != nil {
			return err
		}
		if req.Op == opMove {
			if err := s.checkCallPath(req.Op, req.Dest); err != nil {
				return err
			}
		}
	}
	switch req.Op {
	case opPing:
		return c.reply(reply{Info: s.info()})
	case opExec:
		if err := s.prepareInline(req.Exec); err != nil {
			return err
		}
		cmd, err := s.start(req.Exec)
		if err != nil {
			return err
		}
		info := cmd.info()
		c.f.writeJSON(frameReply, reply{Command: &info}) // flushed by stream
		if err := s.stream(ctx, c, cmd, 0, true, true); err != nil || req.Exec.Call == nil || !req.Exec.Call.End {
			return err
		}
		// The exit event is out: end the call (see CallSpec.End). Had the client left before
		// it, the call would be left for the client's CallEnd.
		ce, err := s.callEnd(cmd.call.id)
		if err != nil {
			return err
		}
		return c.reply(reply{CallEnd: &ce})
	case opStart:
		if req.Exec != nil && req.Exec.Call != nil && (req.Exec.Call.Prepare != nil || req.Exec.Call.End) {
			return errdefs.Invalid("call", "prepare and end are for exec only: start a call's command with a call prepared by CallPrep")
		}
		cmd, err := s.start(req.Exec)
		if err != nil {
			return err
		}
		info := cmd.info()
		return c.reply(reply{Command: &info})
	case opAttach:
		cmd, err := s.lookup(req.ID)
		if err != nil {
			return err
		}
		info := cmd.info()
		if req.Offset < 0 || req.Offset > info.OutputEnd {
			return errdefs.Invalid("offset", "%d is outside [0, %d]", req.Offset, info.OutputEnd)
		}
		c.f.writeJSON(frameReply, reply{Command: &info})
		return s.stream(ctx, c, cmd, req.Offset, req.Follow, false)
	case opStdin:
		return s.writeStdin(c, req)
	case opHostname:
		if s.cfg.SetHostname == nil {
			return errdefs.Invalid("op", "this agent does not set its sandbox's hostname: only a microvm's agent started %s does, once", ClaimableFlag)
		}
		if err := s.cfg.SetHostname(req.Hostname); err != nil {
			return err
		}
		return c.reply(reply{})
	case opSignal:
		if req.Signal <= 0 || req.Signal > 64 {
			return errdefs.Invalid("signal", "%d is not a signal number", req.Signal)
		}
		cmd, err := s.lookup(req.ID)
		if err != nil {
			return err
		}
		if err := s.checkSignal(cmd); err != nil {
			return err
		}
		if err := cmd.signal(syscall.Signal(req.Signal)); err != nil {
			return err
		}
		return c.reply(reply{})
	case opResize:
		if req.Rows == 0 || req.Cols == 0 {
			return errdefs.Invalid("rows", "rows and cols must be positive")
		}
		cmd, err := s.lookup(req.ID)
		if err != nil {
			return err
		}
		if err := cmd.resize(req.Rows, req.Cols); err != nil {
			return err
		}
		return c.reply(reply{})
	case opCommand:
		cmd, err := s.lookup(req.ID)
		if err != nil {
			return err
		}
		info := cmd.info()
		return c.reply(reply{Command: &info})
	case opCommands:
		return c.reply(reply{Commands: s.commandInfos()})
	case opRead:
		return s.readFile(c, req.Path)
	case opWrite:
		return s.writeFile(c, req.Path, writeOptions(req))
	case opStat:
		fi, err := statPath(req.Path)
		if err != nil {
			return err
		}
		return c.reply(reply{File: &fi})
	case opList:
		return s.list(c, req.Path)
	case opMkdir:
		fi, err := s.mkdir(req.Path, writeOptions(req))
		if err != nil {
			return err
		}
		return c.reply(reply{File: &fi})
	case opRemove:
		if err := remove(req.Path, req.Recursive); err != nil {
			return err
		}
		return c.reply(reply{})
	case opMove:
		fi, err := move(req.Path, req.Dest)
		if err != nil {
			return err
		}
		return c.reply(reply{File: &fi})
	case opWatch:
		return s.watch(ctx, c, req.Path, req.Recursive)
	case opTarOut:
		return s.tarOut(c, req.Path)
	case opTarIn:
		return s.tarIn(c, req.Path, writeOptions(req))
	case opCallPrep:
		dir, err := s.callPrep(req.ID, req.Size)
		if err != nil {
			return err
		}
		return c.reply(reply{Dir: dir})
	case opCallEnd:
		ce, err := s.callEnd(req.ID)
		if err != nil {
			return err
		}
		return c.reply(reply{CallEnd: &ce})
	case opDial:
		return s.dialPort(ctx, c, req.Port)
	case opForkIdentity:
		if err := s.forkIdentity(ctx, req.Identity); err != nil {
			return err
		}
		return c.reply(reply{})
	}
	return errdefs.Invalid("op", "unknown operation %q", req.Op)
}

func writeOptions(req *request) WriteOptions {
	if req.Write == nil {
		return WriteOptions{}
	}
	return *req.Write
}

// reply sends r and flushes.
func (c *conn) reply(r reply) error {
	if err := c.f.writeJSON(frameReply, r); err != nil {
		return err
	}
	return c.f.flush()
}

func (s *Server) info() *Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	in := &Info{Version: s.cfg.Version, Pid: os.Getpid(), Commands: len(s.cmds)}
	for _, c := range s.cmds {
		if !c.exited() {
			in.Running++
		}
	}
	return in
}

func (s *Server) lookup(id string) (*command, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cmds[id]
	if c == nil {
		return nil, errdefs.NotFound("command %q", id)
	}
	return c, nil
}

func (s *Server) commandInfos() []CommandInfo {
	s.mu.Lock()
	cmds := make([]*command, 0, len(s.cmds))
	for _, c := range s.cmds {
		cmds = append(cmds, c)
	}
	s.mu.Unlock()
	out := make([]CommandInfo, len(cmds))
	for i, c := range cmds {
		out[i] = c.info()
	}
	slices.SortFunc(out, func(a, b CommandInfo) int { return a.StartedAt.Compare(b.StartedAt) })
	return out
}

// retain keeps an exited command for later Attach and Command calls, within the retention
// bounds, forgetting the oldest ones beyond them.
func (s *Server) retain(c *command) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmds[c.id] != c {
		return
	}
	mem := c.out.retainedMemory()
	c.mu.Lock()
	c.retained = mem
	c.forgetTimer = time.AfterFunc(s.cfg.RetainFor, func() { s.forget(c) })
	c.mu.Unlock()
	s.exited = append(s.exited, c)
	s.retained += mem
	for len(s.exited) > s.cfg.RetainExited || (len(s.exited) > 1 && s.retained > s.cfg.RetainOutputBytes) {
		s.forgetLocked(s.exited[0])
	}
}

func (s *Server) forget(c *command) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetLocked(c)
}

// forgetLocked drops an exited command; its output is freed once no reader still streams it.
// Preconditions: s.mu held.
func (s *Server) forgetLocked(c *command) {
	i := slices.Index(s.exited, c)
	if i < 0 {
		return
	}
	s.exited = slices.Delete(s.exited, i, i+1)
	delete(s.cmds, c.id)
	c.mu.Lock()
	s.retained -= c.retained
	c.forgetTimer.Stop()
	c.mu.Unlock()
}

// stream sends cmd's output from off: data as it comes when follow, until the exit; or up to the
// current end when not. With acceptStdin, data and end frames from the client go to the
// command's stdin. A hang-up by the client ends the stream; the command keeps running.
func (s *Server) stream(ctx context.Context, c *conn, cmd *command, off int64, follow, acceptStdin bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer cancel()
		for {
			typ, p, err := c.f.readFrame()
			if err != nil {
				return
			}
			switch {
			case typ == frameData && acceptStdin:
				if err := cmd.stdin.write(p); err != nil {
					s.log.Debug("stdin", "id", cmd.id, "err", err)
				}
			case typ == frameEnd && acceptStdin:
				cmd.stdin.close()
			default:
				return
			}
		}
	}()

	bufp := pumpBufs.Get().(*[dataChunk]byte)
	defer pumpBufs.Put(bufp)
	buf := bufp[:]
	var ob, db [8]byte
	for {
		var err error
		ch := cmd.out.read(off, buf)
		switch ch.kind {
		case chunkData:
			typ := byte(frameStdout)
			if ch.stream == streamStderr {
				typ = frameStderr
			}
			err = c.f.writeFrame(typ, putOffset(&ob, ch.off), buf[:ch.n])
			off = ch.off + int64(ch.n)
		case chunkTruncated:
			err = c.f.writeFrame(frameTruncated, putOffset(&ob, ch.off), putOffset(&db, ch.dropped))
			off = ch.off
		case chunkEnd:
			b, _ := json.Marshal(ch.exit)
			if err := c.f.writeFrame(frameExit, putOffset(&ob, ch.off), b); err != nil {
				return err
			}
			return c.f.flush()
		case chunkWait:
			if !follow {
				if err := c.f.writeFrame(frameEnd, nil, nil); err != nil {
					return err
				}
				return c.f.flush()
			}
			if err := c.f.flush(); err != nil {
				return err
			}
			select {
			case <-ch.wait:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err != nil {
			return err
		}
	}
}

// writeStdin copies the client's data stream to a command's stdin and, when asked, closes it.
func (s *Server) writeStdin(c *conn, req *request) error {
	cmd, err := s.lookup(req.ID)
	if err != nil {
		return err
	}
	if cmd.stdin == nil || cmd.stdin.closed.Load() {
		return errdefs.Conflict("stdin of command %s is closed", cmd.id)
	}
	for {
		typ, p, err := c.f.readFrame()
		if err != nil {
			return fmt.Errorf("read stdin stream: %w", err)
		}
		switch typ {
		case frameData:
			if err := cmd.stdin.write(p); err != nil {
				if err == errStdinClosed {
					return errdefs.Conflict("stdin of command %s is closed", cmd.id)
				}
				return fmt.Errorf("write stdin of %s: %w", cmd.id, err)
			}
		case frameEnd:
			if req.Close {
				cmd.stdin.close()
			}
			return c.reply(reply{})
		default:
			return fmt.Errorf("unexpected frame %q in stdin stream: %w", typ, errdefs.ErrInvalid)
		}
	}
}

// oomKilledSinceLastCheck reports whether the cgroup's oom_kill count grew since the last check.
func (s *Server) oomKilledSinceLastCheck() bool {
	n := s.readOOMKills()
	s.oomMu.Lock()
	defer s.oomMu.Unlock()
	if n > s.oomSeen {
		s.oomSeen = n
		return true
	}
	return false
}

func (s *Server) readOOMKills() int64 {
	b, err := os.ReadFile(s.cfg.MemoryEvents)
	if err != nil {
		return 0
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("oom_kill ")); ok {
			n, _ := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			return n
		}
	}
	return 0
}

// classify gives err an errdefs kind when it has none, from the system error it wraps.
func classify(err error) error {
	if errdefs.Code(err) != "internal" {
		return err
	}
	var kind error
	switch {
	case errors.Is(err, os.ErrNotExist):
		kind = errdefs.ErrNotFound
	case errors.Is(err, os.ErrExist), errors.Is(err, syscall.ENOTEMPTY):
		kind = errdefs.ErrConflict
	case errors.Is(err, os.ErrPermission), errors.Is(err, syscall.EROFS):
		kind = errdefs.ErrDenied
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ELOOP),
		errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.EINVAL), errors.Is(err, errProtocol):
		kind = errdefs.ErrInvalid
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		kind = errdefs.ErrExhausted
	case errors.Is(err, syscall.EFBIG):
		kind = errdefs.ErrTooLarge
	default:
		return err
	}
	return &classified{err: err, kind: kind}
}

// classified adds an errdefs kind to an error without changing its message.
type classified struct {
	err  error
	kind error
}

func (e *classified) Error() string { return e.err.Error() }
func (e *classified) Unwrap() []error {
	return []error{e.err, e.kind}
}

// permanentAcceptError reports accept errors that no retry can cure: the descriptor is not a
// listening socket (EINVAL — seen when a runtime hands the agent a socket it cannot listen on),
// not a socket, or not open.
func permanentAcceptError(err error) bool {
	return errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOTSOCK) ||
		errors.Is(err, syscall.EBADF) || errors.Is(err, syscall.EOPNOTSUPP)
}
