//go:build linux

package lazy

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// The keeper holds a lazyd's FUSE connection (a descriptor of /dev/fuse) in a process of its
// own, `corral lazyd-keeper`, so that the connection, the mount and the EROFS mounts reading
// through it outlive a lazyd that crashes: their reads wait in the kernel instead of failing.
// It restarts lazyd when the one attached to it dies without saying goodbye; the new lazyd
// attaches, receives the descriptor (SCM_RIGHTS) and resumes the connection (resumeFuse). A
// lazyd whose keeper dies starts another and hands it the descriptor again. The keeper exits
// when lazyd leaves saying "exit" (it unmounted) or when the connection ends.
//
// Protocol on <Dir>/keeper.sock, one attached lazyd at a time:
//
//	lazyd:  attach\n
//	keeper: ok <conn>\n + the descriptor   |   busy\n
//	lazyd:  exit\n                           (before it exits on purpose; EOF without it = died)

const (
	// resumeOnlyEnv, set to 1, has Run exit at once when no keeper holds a connection.
	resumeOnlyEnv = "CORRAL_LAZYD_RESUME_ONLY"
	keeperSock    = "keeper.sock"
	keeperLock    = "keeper.lock"
)

// KeeperConfig configures RunKeeper.
type KeeperConfig struct {
	Dir  string   // lazyd's directory
	Conn string   // the connection's name (its opens file says which connection it describes)
	Dev  *os.File // the connection's /dev/fuse descriptor
	// Restart starts a lazyd for Dir (its full command line) when the attached one dies.
	Restart []string
	Log     *slog.Logger
}

// RunKeeper holds cfg.Dev and serves it to lazyd until lazyd leaves on purpose or the FUSE
// connection ends.
func RunKeeper(cfg KeeperConfig) error {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	lock, err := os.OpenFile(filepath.Join(cfg.Dir, keeperLock), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return fmt.Errorf("another keeper holds %s: %w", cfg.Dir, errdefs.ErrConflict)
	}
	sock := filepath.Join(cfg.Dir, keeperSock)
	os.Remove(sock) // ours: the lock says no other keeper runs
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return err
	}
	defer os.Remove(sock)
	defer ln.Close()
	k := &keeper{cfg: cfg, events: make(chan keeperEvent, 4)}
	go func() { // the connection's end (unmount or abort) shows as POLLERR
		connGone(cfg.Dev, -1)
		k.events <- keeperEvent{kind: "gone"}
	}()
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			go k.serve(c)
		}
	}()
	cfg.Log.Info("lazyd keeper holding the FUSE connection", "conn", cfg.Conn, "pid", os.Getpid())
	backoff := 500 * time.Millisecond
	// The lazyd that started this keeper attaches within moments; one that died before it did
	// leaves nobody to serve the connection, so a lazyd is started if none attached by then.
	retry := time.After(attachGrace)
	for {
		select {
		case <-retry:
			retry = nil
			if !k.isAttached() {
				k.restart()
				retry = time.After(backoff)
				backoff = min(2*backoff, 10*time.Second)
			}
			continue
		case ev := <-k.events:
			switch ev.kind {
			case "gone":
				cfg.Log.Info("the FUSE connection ended: keeper exiting")
				return nil
			case "exit":
				cfg.Log.Info("lazyd exited on purpose: keeper exiting")
				return nil
			case "attached":
				backoff = 500 * time.Millisecond
				retry = nil
			case "died":
				if connGone(cfg.Dev, 0) {
					cfg.Log.Info("lazyd left and the FUSE connection ended: keeper exiting")
					return nil
				}
				cfg.Log.Warn("lazyd died holding the FUSE connection: starting another, which resumes it")
				k.restart()
				retry = time.After(backoff)
			}
		}
	}
}

// attachGrace is how long a new keeper waits for a lazyd to attach before starting one.
const attachGrace = 5 * time.Second

// keeperRuns reports whether a keeper of dir runs (it holds its lock), though it may not
// listen yet.
func keeperRuns(dir string) bool {
	f, err := os.Open(filepath.Join(dir, keeperLock))
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

type keeperEvent struct{ kind string }

type keeper struct {
	cfg    KeeperConfig
	events chan keeperEvent

	mu       sync.Mutex
	attached bool
}

func (k *keeper) isAttached() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.attached
}

// serve answers one lazyd: the descriptor, then it watches for its goodbye or its death.
func (k *keeper) serve(c *net.UnixConn) {
	defer c.Close()
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "attach" {
		return
	}
	k.mu.Lock()
	busy := k.attached
	if !busy {
		k.attached = true
	}
	k.mu.Unlock()
	if busy {
		c.Write([]byte("busy\n"))
		return
	}
	if _, _, err := c.WriteMsgUnix([]byte("ok "+k.cfg.Conn+"\n"), unix.UnixRights(int(k.cfg.Dev.Fd())), nil); err != nil {
		k.mu.Lock()
		k.attached = false
		k.mu.Unlock()
		return
	}
	k.events <- keeperEvent{kind: "attached"}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			break
		}
		if strings.TrimSpace(line) == "exit" {
			k.events <- keeperEvent{kind: "exit"}
			return
		}
	}
	k.mu.Lock()
	k.attached = false
	k.mu.Unlock()
	k.events <- keeperEvent{kind: "died"}
}

// restart starts a lazyd in a session of its own, logging where lazyd logs.
func (k *keeper) restart() {
	argv := k.cfg.Restart
	if len(argv) == 0 {
		k.cfg.Log.Error("no lazyd command to restart with")
		return
	}
	lf, err := os.OpenFile(filepath.Join(k.cfg.Dir, "lazyd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		k.cfg.Log.Error("open lazyd's log", "err", err)
		return
	}
	defer lf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	// It only resumes: if another lazyd takes the connection first and then exits on purpose,
	// this one finds no keeper and exits rather than mounting anew with nobody to serve.
	cmd.Env = append(os.Environ(), resumeOnlyEnv+"=1")
	if err := cmd.Start(); err != nil {
		k.cfg.Log.Error("restart lazyd", "err", err)
		return
	}
	k.cfg.Log.Info("restarted lazyd", "pid", cmd.Process.Pid)
	go cmd.Wait()
}

// connGone waits up to timeoutMs (-1: for ever) for the FUSE connection of dev to end, and says
// whether it did.
func connGone(dev *os.File, timeoutMs int) bool {
	fds := []unix.PollFd{{Fd: int32(dev.Fd())}} // no events asked: POLLERR is always reported
	for {
		n, err := unix.Poll(fds, timeoutMs)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0
	}
}

// keeperLink is a lazyd's attachment to its keeper.
type keeperLink struct {
	conn *net.UnixConn
}

// attachKeeper asks the keeper of dir for the connection it holds. It fails wrapping
// errdefs.ErrNotFound when no keeper answers.
func attachKeeper(dir string) (*keeperLink, *os.File, string, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: filepath.Join(dir, keeperSock), Net: "unix"})
	if err != nil {
		return nil, nil, "", fmt.Errorf("reach lazyd's keeper: %v: %w", err, errdefs.ErrNotFound)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("attach\n")); err != nil {
		c.Close()
		return nil, nil, "", fmt.Errorf("attach to lazyd's keeper: %w", err)
	}
	buf, oob := make([]byte, 256), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		c.Close()
		return nil, nil, "", fmt.Errorf("attach to lazyd's keeper: %w", err)
	}
	reply := strings.TrimSpace(string(buf[:n]))
	id, ok := strings.CutPrefix(reply, "ok ")
	if !ok {
		c.Close()
		return nil, nil, "", fmt.Errorf("lazyd's keeper answered %q: %w", reply, errdefs.ErrConflict)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		c.Close()
		return nil, nil, "", fmt.Errorf("lazyd's keeper sent no descriptor (%v)", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		c.Close()
		return nil, nil, "", fmt.Errorf("lazyd's keeper sent no descriptor (%v)", err)
	}
	unix.CloseOnExec(fds[0])
	c.SetDeadline(time.Time{})
	return &keeperLink{conn: c}, os.NewFile(uintptr(fds[0]), "/dev/fuse"), id, nil
}

// startKeeper starts a keeper holding dev for connection id (command: the keeper's command
// line, to which the connection and the lazyd command to restart are added) and attaches to it.
func startKeeper(dir string, command, restart []string, dev *os.File, id string, log *slog.Logger) (*keeperLink, error) {
	argv := append(append(append([]string{}, command...), "--conn", id, "--"), restart...)
	lf, err := os.OpenFile(filepath.Join(dir, "lazyd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.ExtraFiles = []*os.File{dev} // fd 3
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	lf.Close()
	if err != nil {
		return nil, fmt.Errorf("start lazyd's keeper: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); ; {
		link, kdev, kid, err := attachKeeper(dir)
		if err == nil {
			kdev.Close() // the same connection as dev
			if kid != id {
				link.conn.Close()
				return nil, fmt.Errorf("lazyd's keeper holds connection %s, not %s: %w", kid, id, errdefs.ErrConflict)
			}
			log.Info("lazyd's keeper holds the FUSE connection", "pid", cmd.Process.Pid, "conn", id)
			return link, nil
		}
		select {
		case werr := <-exited:
			return nil, fmt.Errorf("lazyd's keeper exited (%v): %w", werr, err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) || !errors.Is(err, errdefs.ErrNotFound) {
			return nil, fmt.Errorf("lazyd's keeper did not answer: %w", err)
		}
	}
}

// goodbye tells the keeper that lazyd exits on purpose (it unmounted): the keeper exits too.
func (k *keeperLink) goodbye() {
	k.conn.Write([]byte("exit\n"))
	k.conn.Close()
}

// watch calls died when the keeper goes (EOF on the attachment) unless stop was closed first.
func (k *keeperLink) watch(stop <-chan struct{}, died func()) {
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := k.conn.Read(buf); err != nil {
				break
			}
		}
		select {
		case <-stop:
		default:
			died()
		}
	}()
}
