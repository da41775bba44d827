//go:build linux

package lazy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/blobstore"
)

// The test binary doubles as lazyd and its keeper (as `corral lazyd` and `corral lazyd-keeper`
// are one binary), so that TestTakeoverAfterKill can kill a real process.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "lazy-test-lazyd":
			os.Exit(testLazydMain(os.Args[2:]))
		case "lazy-test-keeper":
			os.Exit(testKeeperMain(os.Args[2:]))
		case "lazy-test-mmap":
			// A reader of its own: a thread stuck in a page fault stops a Go process's
			// garbage collector, which would stall the test itself.
			want, _ := os.ReadFile(os.Args[3])
			if err := mmapCompare(os.Args[2], want); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
	os.Exit(m.Run())
}

// testLazydMain serves DIR from blob store SPEC; <DIR>/test-delay, when present, holds a delay
// in milliseconds added to every ranged read.
func testLazydMain(args []string) int {
	dir, spec := args[0], args[1]
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	st, err := blobstore.Open(ctx, spec)
	if err != nil {
		log.Error("open the blob store", "err", err)
		return 1
	}
	exe, _ := os.Executable()
	err = Run(ctx, Config{Dir: dir, Blobs: &delayedStore{Store: st, dir: dir}, ReadTimeout: 30 * time.Second, CatchUp: -1, Readahead: -1,
		KeeperCommand: []string{exe, "lazy-test-keeper", dir}, RestartCommand: append([]string{exe}, os.Args[1:]...), Log: log})
	if err != nil {
		log.Error("lazyd", "err", err)
		return 1
	}
	return 0
}

// testKeeperMain is `lazy-test-keeper DIR --conn ID -- COMMAND...` with the connection at fd 3.
func testKeeperMain(args []string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if len(args) < 5 || args[1] != "--conn" || args[3] != "--" {
		log.Error("usage", "args", args)
		return 2
	}
	if err := RunKeeper(KeeperConfig{Dir: args[0], Conn: args[2], Dev: os.NewFile(3, "/dev/fuse"), Restart: args[4:], Log: log}); err != nil {
		log.Error("keeper", "err", err)
		return 1
	}
	return 0
}

type delayedStore struct {
	blobstore.Store
	dir string
}

func (d *delayedStore) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	if b, err := os.ReadFile(filepath.Join(d.dir, "test-delay")); err == nil {
		ms, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		os.WriteFile(filepath.Join(d.dir, "test-fetching"), nil, 0o600) // a read waits on us
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return d.Store.GetRange(ctx, key, off, length)
}

// startLazydProcess builds a fixture and starts lazyd for it as a process of its own (the test
// binary as lazyd, with a keeper); lazyd.log is shown if the test fails.
func startLazydProcess(t *testing.T) (*fixture, StartOptions, *Client) {
	t.Helper()
	f := buildFixture(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	opts := StartOptions{Dir: f.dir, BlobStore: f.spec, Command: []string{exe, "lazy-test-lazyd", f.dir, f.spec}}
	c, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	f.client = c
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(f.dir, "lazyd.log"))
			t.Logf("lazyd.log:\n%s", b)
		}
	})
	return f, opts, c
}

// TestTakeoverAfterKill: lazyd runs as its own process with a keeper. It is killed with SIGKILL
// while a READ it took from the kernel waits on a slow blob store, and while an mmap reader
// faults on the same layer. The keeper starts another lazyd, which resumes the connection and
// has the kernel resend the unanswered READ: both readers get every byte right, nobody gets EIO
// or SIGBUS. Then lazyd exits once unused, and the keeper with it.
func TestTakeoverAfterKill(t *testing.T) {
	f, opts, c := startLazydProcess(t)
	mnt, unmount := f.mount()
	want, _ := os.ReadFile(filepath.Join(f.src, "big.bin"))
	if got, err := os.ReadFile(filepath.Join(mnt, "small/f007")); err != nil || len(got) == 0 {
		t.Fatalf("read through the first lazyd: %v", err)
	}

	// Every ranged read now takes 2 s: the next miss is a READ lazyd holds when it dies.
	os.WriteFile(filepath.Join(f.dir, "test-delay"), []byte("2000"), 0o600)
	readDone := make(chan error, 1)
	go func() {
		got, err := os.ReadFile(filepath.Join(mnt, "big.bin"))
		if err == nil && !bytes.Equal(got, want) {
			err = fmt.Errorf("read %d bytes, not the file's %d (or other bytes)", len(got), len(want))
		}
		readDone <- err
	}()
	mmapDone := make(chan error, 1)
	go func() {
		out, err := exec.Command(opts.Command[0], "lazy-test-mmap", filepath.Join(mnt, "copy/big.bin"), filepath.Join(f.src, "big.bin")).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%v: %s", err, out)
		}
		mmapDone <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(f.dir, "test-fetching")); err == nil {
			break // lazyd holds a READ: it waits on the blob store
		}
		if time.Now().After(deadline) {
			t.Fatal("no read reached the blob store")
		}
	}
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(info.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for name, ch := range map[string]chan error{"read(2)": readDone, "mmap": mmapDone} {
		select {
		case err := <-ch:
			if err != nil {
				t.Errorf("%s reader across the kill: %v", name, err)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("%s reader still waits 60 s after the kill", name)
		}
	}
	t.Logf("readers done %s after the kill", time.Since(killed).Round(time.Millisecond))
	log, _ := os.ReadFile(filepath.Join(f.dir, "lazyd.log"))
	for _, line := range []string{"lazyd died holding the FUSE connection", "resumed the FUSE connection", "answering requests the previous lazyd left"} {
		if !strings.Contains(string(log), line) {
			t.Errorf("lazyd.log lacks %q", line)
		}
	}

	// The new lazyd counts the mount as open (from the opens file): it stays until the unmount,
	// then exits once its new client lets go, and the keeper exits with it.
	os.Remove(filepath.Join(f.dir, "test-delay"))
	c2, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	info2, _ := c2.Info(context.Background())
	if info2.Pid == info.Pid {
		t.Fatalf("lazyd pid %d after the kill", info2.Pid)
	}
	unmount()
	c2.Close()
	f.client = nil
	awaitAllGone(t, f, info2.Pid)
}

// awaitAllGone waits for lazyd (pid), its keeper and the FUSE mount to go once nothing is
// mounted through it and no client holds it.
func awaitAllGone(t *testing.T, f *fixture, pid int) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		lazyd, keeper := pidAlive(pid), keeperRuns(f.dir)
		if !lazyd && !keeper && !isFuseMount(filepath.Join(f.dir, mntDir)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("15 s after the last unmount: lazyd alive %v, keeper alive %v, FUSE mounted %v", lazyd, keeper, isFuseMount(filepath.Join(f.dir, mntDir)))
		}
	}
}

// mmapCompare maps path and compares it with want, reporting a SIGBUS as an error.
func mmapCompare(path string, want []byte) (err error) {
	fd, err := os.Open(path)
	if err != nil {
		return err
	}
	defer fd.Close()
	m, err := syscall.Mmap(int(fd.Fd()), 0, len(want), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return err
	}
	defer syscall.Munmap(m)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("fault reading the mapping: %v", r)
		}
	}()
	if !bytes.Equal(m, want) {
		return fmt.Errorf("the mapping differs from the file")
	}
	return nil
}

func pidAlive(pid int) bool { return syscall.Kill(pid, 0) == nil && !zombie(pid) }

func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	_, after, _ := strings.Cut(string(b), ") ")
	return strings.HasPrefix(after, "Z")
}

// TestKeeperReplacedThenLazydKilled: the keeper is killed, lazyd starts another, and lazyd is
// killed the moment the new keeper runs, before it could attach to it (seen in a loaded full
// run: the new keeper waited for a lazyd for ever, and a lazyd started meanwhile found no
// keeper socket, detached the live mount and mounted afresh, so readers of the kept
// connection hung). The new keeper starts a lazyd that resumes its connection, and a read
// through the mount gets its bytes.
func TestKeeperReplacedThenLazydKilled(t *testing.T) {
	f, opts, c := startLazydProcess(t)
	mnt, unmount := f.mount()
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	keepers := pidsOf(t, "lazy-test-keeper", f.dir)
	if len(keepers) != 1 {
		t.Fatalf("keepers: %v", keepers)
	}
	syscall.Kill(keepers[0], syscall.SIGKILL)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if k := pidsOf(t, "lazy-test-keeper", f.dir); len(k) == 1 && k[0] != keepers[0] && keeperRuns(f.dir) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("lazyd started no other keeper")
		}
	}
	syscall.Kill(info.Pid, syscall.SIGKILL)
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("1"), 0)
	want, _ := os.ReadFile(filepath.Join(f.src, "big.bin"))
	done := make(chan error, 1)
	go func() {
		got, err := os.ReadFile(filepath.Join(mnt, "big.bin"))
		if err == nil && !bytes.Equal(got, want) {
			err = fmt.Errorf("read %d bytes, not the file's %d (or other bytes)", len(got), len(want))
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("read after the kills: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("a read through the mount still waits 60 s after the kills")
	}
	if log, _ := os.ReadFile(filepath.Join(f.dir, "lazyd.log")); !strings.Contains(string(log), "resumed the FUSE connection") {
		t.Error("no lazyd resumed the kept connection")
	}
	c2, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	info2, _ := c2.Info(context.Background())
	unmount()
	c2.Close()
	f.client = nil
	awaitAllGone(t, f, info2.Pid)
}

// pidsOf lists the processes whose command line holds every one of words.
func pidsOf(t *testing.T, words ...string) []int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || zombie(pid) {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if slices.IndexFunc(words, func(w string) bool { return !slices.Contains(args, w) }) < 0 {
			out = append(out, pid)
		}
	}
	return out
}
