package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/runtime"
)

// TestPauseResume pauses a sandbox that holds 128 MiB of anonymous memory, first without swap
// (when the host has none: page cache only), then with a temporary swap file, and checks the
// memory went out, the state reads paused, a new Runtime (a restarted caller) resumes it, and
// the memory and the sandbox are intact. Also the errors, and the repair of a crashed Pause.
func TestPauseResume(t *testing.T) {
	needRoot(t)
	noSwap := !hostHasSwap()
	e := newTestEnv(t, nil)
	ctx := context.Background()
	const held = 128 << 20
	s := e.spec("pause-1")
	s.MemoryBytes = 256 << 20
	sb := e.create(s)
	okSh(t, sb.AgentSocket, fmt.Sprintf("@hold %d", held>>20))

	for _, id := range []string{"nope", "pause-2"} {
		if _, err := e.r.Pause(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Pause(%s) = %v, want not found", id, err)
		}
		if _, err := e.r.Resume(ctx, id); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("Resume(%s) = %v, want not found", id, err)
		}
	}
	if _, err := e.r.Resume(ctx, s.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Resume of a running sandbox = %v, want conflict", err)
	}

	if noSwap {
		ps := pause(t, e, s.ID)
		if !ps.NoSwap || ps.Swapped != 0 || ps.MemoryAfter < held {
			t.Errorf("pause without swap: %+v, want NoSwap, nothing swapped, the %d held bytes still charged", ps, held)
		}
		resume(t, e, s.ID)
		if got := okSh(t, sb.AgentSocket, "@check"); got != "ok 128 MiB" {
			t.Errorf("@check after a pause without swap = %q", got)
		}
	} else {
		t.Log("the host has swap: the no-swap case is not tested")
	}

	enableSwap(t, e, 512<<20)
	ps := pause(t, e, s.ID)
	if _, err := e.r.Pause(ctx, s.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Pause of a paused sandbox = %v, want conflict", err)
	}
	if ps.NoSwap || ps.MemoryReturned < held*9/10 || ps.Swapped < held*9/10 {
		t.Errorf("pause with swap: %+v, want at least 90%% of the %d held bytes returned and swapped", ps, held)
	}
	if st, _ := e.r.Status(ctx, s.ID); st.MemoryBytes+held*9/10 > ps.MemoryBefore {
		t.Errorf("Status.MemoryBytes while paused = %d, want at most %d", st.MemoryBytes, ps.MemoryBefore-held*9/10)
	}
	if _, err := os.Stat(filepath.Join(sb.Dir, pauseFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left after Pause: %v", pauseFile, err)
	}

	// A restarted caller resumes the sandbox its predecessor paused.
	if err := e.r.Close(); err != nil {
		t.Fatal(err)
	}
	e.r = e.open()
	rs := resume(t, e, s.ID)
	if rs.InSwap < held*9/10 {
		t.Errorf("ResumeStats.InSwap = %d, want most of the %d held bytes", rs.InSwap, held)
	}
	if got := okSh(t, sb.AgentSocket, "@check"); got != "ok 128 MiB" {
		t.Errorf("@check after resume = %q", got)
	}
	if got := okSh(t, sb.AgentSocket, "echo alive; cat /etc/corral-layer"); got != "alive\ntop" {
		t.Errorf("command after resume = %q", got)
	}
	if _, err := e.r.Resume(ctx, s.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second Resume = %v, want conflict", err)
	}

	// A Pause that crashed half-way left a lowered limit and pause.json: Resume puts it back
	// even though it refuses (the sandbox is running), and the next Pause would too.
	usage, err := e.r.cg.MemUsage(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	knob, crashed := filepath.Join(e.r.cg.Dir("memory", s.ID), "memory.limit_in_bytes"), strconv.FormatUint(usage+8<<20, 10)
	if e.r.cg.Mode == "v2" {
		knob, crashed = filepath.Join(e.r.cg.Dir("", s.ID), "memory.swap.max"), "max"
	}
	orig := readFileTrim(t, knob)
	if err := e.r.saveMemory(s.ID, map[string]string{filepath.Base(knob): orig}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(knob, []byte(crashed), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.r.Resume(ctx, s.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Resume of a running sandbox = %v, want conflict", err)
	}
	if got := readFileTrim(t, knob); got != orig {
		t.Errorf("%s after the repair = %s, want %s", filepath.Base(knob), got, orig)
	}
	if _, err := os.Stat(filepath.Join(sb.Dir, pauseFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left after the repair: %v", pauseFile, err)
	}

	// A Pause whose ctx ends leaves the sandbox running, its settings as they were.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := e.r.Pause(cctx, s.ID); !errors.Is(err, context.Canceled) {
		t.Errorf("Pause with a cancelled ctx = %v, want context.Canceled", err)
	}
	if st, err := e.r.Status(ctx, s.ID); err != nil || st.State != runtime.StateRunning {
		t.Errorf("Status after a cancelled Pause = %+v %v, want running", st, err)
	}
	if got := readFileTrim(t, knob); got != orig {
		t.Errorf("%s after a cancelled Pause = %s, want %s", filepath.Base(knob), got, orig)
	}

	// A stopped sandbox can be neither paused nor resumed.
	if err := unix.Kill(sb.Pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool {
		st, err := e.r.Status(ctx, s.ID)
		return err == nil && st.State == runtime.StateStopped
	})
	if _, err := e.r.Pause(ctx, s.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Pause of a stopped sandbox = %v, want conflict", err)
	}
	if _, err := e.r.Resume(ctx, s.ID); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Resume of a stopped sandbox = %v, want conflict", err)
	}
}

// TestDeletePaused deletes a paused sandbox with a child process; the teardown checks that
// nothing is left (processes, cgroups, mounts).
func TestDeletePaused(t *testing.T) {
	e := newTestEnv(t, nil)
	ctx := context.Background()
	sb := e.create(e.spec("paused-del"))
	okSh(t, sb.AgentSocket, "sleep 1000 >/dev/null 2>&1 &")
	if _, err := e.r.Pause(ctx, sb.ID); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if st, err := e.r.Status(ctx, sb.ID); err != nil || st.State != runtime.StatePaused {
		t.Fatalf("Status = %+v %v, want paused", st, err)
	}
	if err := e.r.Delete(ctx, sb.ID); err != nil {
		t.Fatalf("Delete of a paused sandbox: %v", err)
	}
	if _, err := e.r.Status(ctx, sb.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Status after Delete = %v, want not found", err)
	}
}

// TestPauseLatency measures Pause and Resume of a sandbox holding CORRAL_PAUSE_MIB (default 128)
// MiB of anonymous memory, CORRAL_BENCH_N rounds (default 2), with swap (a temporary swap file
// if the host has none). Every round pauses and resumes twice, with and without the prefetch,
// and times the first full read of the memory after each Resume. Skipped with -short.
//
//	CORRAL_PAUSE_MIB=512 CORRAL_BENCH_N=10 go test ./internal/runtime/runc -run TestPauseLatency -v -count=1
func TestPauseLatency(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: a latency measurement")
	}
	needRoot(t)
	mib, n := 128, 2
	if v, err := strconv.Atoi(os.Getenv("CORRAL_PAUSE_MIB")); err == nil && v > 0 {
		mib = v
	}
	if v, err := strconv.Atoi(os.Getenv("CORRAL_BENCH_N")); err == nil && v > 0 {
		n = v
	}
	e := newTestEnv(t, nil)
	enableSwap(t, e, int64(mib)<<21)
	s := e.spec("pause-lat")
	s.MemoryBytes = int64(mib)<<20 + 256<<20
	sb := e.create(s)
	start := time.Now()
	okSh(t, sb.AgentSocket, fmt.Sprintf("@hold %d", mib))
	fillTime := time.Since(start)
	start = time.Now()
	okSh(t, sb.AgentSocket, "@check")
	checkTime := time.Since(start)

	var freeze, pauseD, resumeD, resumeNoPF, prefetched, readPF, readPrefetched, readNoPF []time.Duration
	var returned, swapped []float64
	// Three ways to resume: prefetch and read at once; prefetch, wait until it is done, read;
	// no prefetch, read.
	for range n {
		for mode := range 3 {
			// Dirty every page: a clean page read back from swap keeps its swap copy, and the
			// next Pause would only drop it.
			okSh(t, sb.AgentSocket, fmt.Sprintf("@hold %d", mib))
			ps := pause(t, e, s.ID)
			freeze, pauseD = append(freeze, ps.Freeze), append(pauseD, ps.Duration)
			returned = append(returned, float64(ps.MemoryReturned)/float64(mib<<20))
			swapped = append(swapped, float64(ps.Swapped)/float64(mib<<20))
			e.r.noPrefetch = mode == 2
			rs := resume(t, e, s.ID)
			if mode == 1 {
				prefetched = append(prefetched, waitPrefetch(t, e.r, s.ID))
			}
			start := time.Now()
			okSh(t, sb.AgentSocket, "@check")
			read := time.Since(start)
			switch mode {
			case 0:
				resumeD, readPF = append(resumeD, rs.Duration), append(readPF, read)
			case 1:
				resumeD, readPrefetched = append(resumeD, rs.Duration), append(readPrefetched, read)
			case 2:
				resumeNoPF, readNoPF = append(resumeNoPF, rs.Duration), append(readNoPF, read)
			}
		}
	}
	e.r.noPrefetch = false
	p := func(d []time.Duration, q float64) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		i := int(float64(len(d))*q+0.999999) - 1
		return d[max(0, min(i, len(d)-1))].Round(100 * time.Microsecond)
	}
	pf := func(f []float64, q float64) string {
		f = slices.Clone(f)
		slices.Sort(f)
		i := int(float64(len(f))*q+0.999999) - 1
		return fmt.Sprintf("%.1f%%", 100*f[max(0, min(i, len(f)-1))])
	}
	t.Logf("%d MiB held, %d rounds; filling it took %v, reading it back (resident) %v", mib, n, fillTime.Round(time.Millisecond), checkTime.Round(time.Millisecond))
	t.Logf("Pause: frozen after           p50 %v  p99 %v", p(freeze, 0.5), p(freeze, 0.99))
	t.Logf("Pause: total (with reclaim)   p50 %v  p99 %v", p(pauseD, 0.5), p(pauseD, 0.99))
	t.Logf("Pause: returned / held        p50 %s  min %s; swapped / held p50 %s", pf(returned, 0.5), pf(returned, 0), pf(swapped, 0.5))
	t.Logf("Resume                        p50 %v  p99 %v; without prefetch p50 %v", p(resumeD, 0.5), p(resumeD, 0.99), p(resumeNoPF, 0.5))
	t.Logf("prefetch done after Resume    p50 %v  p99 %v (in the background)", p(prefetched, 0.5), p(prefetched, 0.99))
	t.Logf("first full read after Resume  p50 %v with prefetch, %v after the prefetch was done, %v without",
		p(readPF, 0.5), p(readPrefetched, 0.5), p(readNoPF, 0.5))
}

func TestSwapRanges(t *testing.T) {
	maps := `55d0c4a00000-55d0c4a21000 r--p 00000000 08:01 1835029                    /usr/bin/app
55d0c4c21000-55d0c4c42000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0008000000 rw-p 00000000 00:00 0 
7f0008000000-7f0008001000 ---p 00000000 00:00 0 
7f0010000000-7f0010100000 rw-s 00000000 00:1a 12                         /dev/shm/buf
7f0020000000-7f0020001000 rw-p 00001000 07:03 99                         /lib/libc.so.6
7f0030000000-7f0030002000 rw-p 00000000 00:00 0                          [anon:arena]
7ffd1c000000-7ffd1c021000 rw-p 00000000 00:00 0                          [stack]
7ffd1c1fe000-7ffd1c200000 r--p 00000000 00:00 0                          [vvar]
7ffd1c200000-7ffd1c202000 r-xp 00000000 00:00 0                          [vdso]
bogus line
`
	var got []string
	for _, v := range swapRanges([]byte(maps)) {
		got = append(got, fmt.Sprintf("%x+%x", v.base, v.len))
	}
	want := []string{
		"55d0c4c21000+21000",                           // heap
		"7f0000000000+4000000", "7f0004000000+4000000", // 128 MiB anonymous, in prefetchBytes pieces
		"7f0010000000+100000", // tmpfs
		"7f0030000000+2000",   // named anonymous
		"7ffd1c000000+21000",  // stack
	}
	if !slices.Equal(got, want) {
		t.Errorf("swapRanges = %v, want %v", got, want)
	}
}

// waitPrefetch waits until id's background prefetch has ended and returns how long it waited.
func waitPrefetch(t *testing.T, r *Runtime, id string) time.Duration {
	start := time.Now()
	waitFor(t, 30*time.Second, func() bool {
		r.prefetchMu.Lock()
		defer r.prefetchMu.Unlock()
		return r.prefetches[id] == nil
	})
	return time.Since(start)
}

func pause(t *testing.T, e *testEnv, id string) runtime.PauseStats {
	t.Helper()
	ps, err := e.r.Pause(context.Background(), id)
	if err != nil {
		t.Fatalf("Pause(%s): %v", id, err)
	}
	if st, err := e.r.Status(context.Background(), id); err != nil || st.State != runtime.StatePaused {
		t.Fatalf("Status after Pause = %+v %v, want paused", st, err)
	}
	t.Logf("Pause(%s): %+v", id, ps)
	return ps
}

func resume(t *testing.T, e *testEnv, id string) runtime.ResumeStats {
	t.Helper()
	rs, err := e.r.Resume(context.Background(), id)
	if err != nil {
		t.Fatalf("Resume(%s): %v", id, err)
	}
	if st, err := e.r.Status(context.Background(), id); err != nil || st.State != runtime.StateRunning {
		t.Fatalf("Status after Resume = %+v %v, want running", st, err)
	}
	t.Logf("Resume(%s): %+v", id, rs)
	return rs
}

func readFileTrim(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// enableSwap makes sure the host has swap for the rest of the test: if it has none, it enables
// a swap file of size bytes and, at the end, deletes e's sandboxes (so that nothing of theirs
// is left in it) and removes it again. It skips the test if that fails (no mkswap, a
// filesystem that cannot hold swap files).
func enableSwap(t *testing.T, e *testEnv, size int64) {
	t.Helper()
	if hostHasSwap() {
		return
	}
	mkswap, err := exec.LookPath("mkswap")
	if err != nil {
		t.Skip("needs mkswap (util-linux) for a temporary swap file")
	}
	var errs []error
	for _, dir := range []string{e.top, "/var/tmp"} {
		p := filepath.Join(dir, fmt.Sprintf("corral-test-swap-%d", os.Getpid()))
		err := makeSwapFile(mkswap, p, size)
		if err == nil {
			t.Cleanup(func() {
				ctx := context.Background()
				if e.r != nil {
					ids, _ := e.r.List(ctx)
					for _, id := range ids {
						e.r.Delete(ctx, id)
					}
				}
				if err := swapoff(p); err != nil {
					t.Errorf("swapoff %s: %v", p, err)
				}
				os.Remove(p)
			})
			return
		}
		os.Remove(p)
		errs = append(errs, err)
	}
	t.Skipf("cannot enable a temporary swap file: %v", errors.Join(errs...))
}

func makeSwapFile(mkswap, p string, size int64) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, size)
	f.Close()
	if err != nil {
		return fmt.Errorf("fallocate %s: %w", p, err)
	}
	if out, err := exec.Command(mkswap, p).CombinedOutput(); err != nil {
		return fmt.Errorf("mkswap %s: %v: %s", p, err, out)
	}
	if err := swapon(p); err != nil {
		return fmt.Errorf("swapon %s: %w", p, err)
	}
	return nil
}

func swapon(p string) error {
	b, err := unix.BytePtrFromString(p)
	if err != nil {
		return err
	}
	if _, _, e := unix.Syscall(unix.SYS_SWAPON, uintptr(unsafe.Pointer(b)), 0, 0); e != 0 {
		return e
	}
	return nil
}

func swapoff(p string) error {
	b, err := unix.BytePtrFromString(p)
	if err != nil {
		return err
	}
	if _, _, e := unix.Syscall(unix.SYS_SWAPOFF, uintptr(unsafe.Pointer(b)), 0, 0); e != 0 {
		return e
	}
	return nil
}
