package e2e

import (
	"context"
	"crypto/md5"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// lzLoop runs in each reader sandbox until /tmp/stop exists: every file of the lazily fetched
// toolkit is checked with read(2) (busybox md5sum) and through mmap (mmapsum, itself exec-ed
// from the toolkit, a different copy each time); any failure, wrong byte or signal (SIGBUS:
// exit 135) is appended to /tmp/errors. /tmp/iter counts finished rounds.
const lzLoop = `i=0
while [ ! -e /tmp/stop ]; do
	i=$((i+1))
	out=$(cd /opt/lz/data && md5sum -c /opt/lz/MD5 2>&1) || echo "read round $i: $out" >>/tmp/errors
	out=$(/opt/lz/bin/m$((i % 4)) /opt/lz/SHA 2>&1)
	rc=$?
	[ $rc = 0 ] || echo "mmap round $i: exit $rc: $out" >>/tmp/errors
	echo $i >/tmp/iter
done
echo done >/tmp/done
`

// TestFaultLazydKill (runc, gVisor, microvm): lazyd is killed with SIGKILL five times while sandboxes read a lazily
// fetched layer continuously (read(2) and mmap, every byte checked) and creates run. Its keeper
// holds the FUSE connection and starts another lazyd, which resumes it: no reader sees an error,
// a SIGBUS or a wrong byte (they wait), every create succeeds, the readers are served again
// within 30 s of each kill (3 min for a microvm under TCG), and nothing is left on the host once
// corral stops.
func TestFaultLazydKill(t *testing.T) {
	needRoot(t)
	forRuntimes(t, testFaultLazydKill)
}

func testFaultLazydKill(t *testing.T, rt string) {
	readers, kills, back := 3, 5, 30*time.Second
	if rt == "microvm" {
		// Under TCG on a small host a VM takes tens of seconds to start, and a round as long.
		readers, kills, back = 1, 2, 3*time.Minute
	}
	p := withBaseOn(t, rt)

	// The toolkit: random files of 64 KiB to 1 MiB, their sums, the mmap checker (4 copies).
	tk := t.TempDir()
	for _, d := range []string{"opt/lz/data", "opt/lz/bin"} {
		os.MkdirAll(filepath.Join(tk, d), 0o755)
	}
	var md5s, shas strings.Builder
	for i := range 24 {
		b := make([]byte, 64<<10+i*40<<10)
		rand.Read(b)
		name := fmt.Sprintf("f%02d", i)
		os.WriteFile(filepath.Join(tk, "opt/lz/data", name), b, 0o644)
		m, s := md5.Sum(b), sha256.Sum256(b)
		fmt.Fprintf(&md5s, "%s  %s\n", hex.EncodeToString(m[:]), name)
		fmt.Fprintf(&shas, "%s  /opt/lz/data/%s\n", hex.EncodeToString(s[:]), name)
	}
	os.WriteFile(filepath.Join(tk, "opt/lz/MD5"), []byte(md5s.String()), 0o644)
	os.WriteFile(filepath.Join(tk, "opt/lz/SHA"), []byte(shas.String()), 0o644)
	os.WriteFile(filepath.Join(tk, "opt/lz/loop.sh"), []byte(lzLoop), 0o755)
	probe := filepath.Join(t.TempDir(), "mmapsum")
	build := exec.Command("go", "build", "-o", probe, "./testdata/mmapsum")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the mmap checker: %v\n%s", err, out)
	}
	bin, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		// A byte of difference each: EROFS shares no page cache between them.
		os.WriteFile(filepath.Join(tk, "opt/lz/bin", fmt.Sprintf("m%d", i)), append(slices.Clone(bin), byte(i)), 0o755)
	}
	p.importDirWith(p.Client, "lz", "1", corral.KindToolkit, tk, corral.ImportOptions{})
	req := corral.CreateRequest{Toolkits: []corral.LayerRef{"lz:1"}, Fetch: "lazy"}

	var ids []string
	// Readers' next pages come from lazyd, not from the host's page cache. A microvm guest
	// keeps what it read in a cache of its own, which a sandbox cannot drop: there, a
	// sandbox created after each kill proves that lazyd serves again.
	dropCaches := func() {
		if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("1"), 0); err != nil {
			t.Fatal(err)
		}
	}
	for range readers {
		sb := p.create(req)
		ids = append(ids, sb.ID)
		p.sh(sb.ID, "(setsid sh /opt/lz/loop.sh </dev/null >/dev/null 2>&1 &)")
	}
	rounds := func() []int {
		out := make([]int, len(ids))
		for i, id := range ids {
			o, _, _ := p.run(id, "cat", "/tmp/iter")
			out[i], _ = strconv.Atoi(strings.TrimSpace(o))
		}
		return out
	}
	// Every reader finished a round started after `after` (at least two more than then).
	servedSince := func(after []int) bool {
		for i, n := range rounds() {
			if n < after[i]+2 {
				return false
			}
		}
		return true
	}
	eventually(t, 2*back, "each reader to finish two rounds", func() bool { return servedSince(make([]int, readers)) })

	ctx := context.Background()
	var restartTook, backTook []time.Duration
	var createsTried, createsFailed atomic.Int32
	// createAndRead creates a sandbox of the layer and reads the layer whole in it: its pages
	// come from lazyd (no page cache has them, a microvm guest's included).
	createAndRead := func(when string) {
		createsTried.Add(1)
		r := corral.CreateRequest{Base: "base:test", Toolkits: req.Toolkits, Fetch: "lazy", Runtime: rt}
		if rt == "microvm" {
			r.Runtime, r.Tier, r.Limits.MemoryBytes = "", "microvm", 256<<20
		}
		sb, err := p.Client.CreateSandbox(ctx, r)
		if err != nil {
			createsFailed.Add(1)
			t.Errorf("%s: create: %v", when, err)
			return
		}
		defer p.Client.DeleteSandbox(ctx, sb.ID)
		if _, errOut, exit := p.run(sb.ID, "/bin/sh", "-c", "cd /opt/lz/data && md5sum -c /opt/lz/MD5 >/dev/null"); exit == nil || exit.Code != 0 {
			t.Errorf("%s: a sandbox created then reads its layer: exit %+v: %s", when, exit, errOut)
		}
	}
	for k := range kills {
		pids := lazydPids(p.DataDir)
		if len(pids) != 1 {
			t.Fatalf("kill %d: lazyd processes of the data dir: %v", k, pids)
		}
		before := rounds()
		dropCaches()
		pid, _ := strconv.Atoi(pids[0])
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		// A create right after the crash, and its sandbox reads the layer whole.
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			createAndRead(fmt.Sprintf("kill %d", k))
		}()
		eventually(t, time.Minute, "another lazyd to serve", func() bool {
			got := lazydPids(p.DataDir)
			return len(got) == 1 && got[0] != pids[0] && lazydAnswers(p.DataDir)
		})
		restartTook = append(restartTook, time.Since(killed))
		eventually(t, back, "every reader to be served again", func() bool { return servedSince(before) })
		backTook = append(backTook, time.Since(killed))
		wg.Wait()
	}

	// The keeper killed: lazyd starts another and hands it the connection; a lazyd killed
	// after that is replaced as before.
	keepers := lazydKeeperPids(p.DataDir)
	if len(keepers) != 1 {
		t.Fatalf("keepers of the data dir: %v", keepers)
	}
	kpid, _ := strconv.Atoi(keepers[0])
	syscall.Kill(kpid, syscall.SIGKILL)
	eventually(t, 30*time.Second, "another keeper", func() bool {
		got := lazydKeeperPids(p.DataDir)
		return len(got) == 1 && got[0] != keepers[0]
	})
	before := rounds()
	dropCaches()
	pids := lazydPids(p.DataDir)
	lpid, _ := strconv.Atoi(pids[0])
	syscall.Kill(lpid, syscall.SIGKILL)
	eventually(t, back, "every reader to be served again after a kill under the new keeper", func() bool { return servedSince(before) })
	createAndRead("after the keeper and lazyd were killed")

	for _, id := range ids {
		p.sh(id, "touch /tmp/stop")
	}
	for _, id := range ids {
		eventually(t, time.Minute, "the reader loop to end", func() bool {
			_, _, exit := p.run(id, "test", "-e", "/tmp/done")
			return exit != nil && exit.Code == 0
		})
		if out := p.sh(id, "cat /tmp/errors 2>/dev/null; true"); out != "" {
			t.Errorf("sandbox %s: readers saw errors across the kills:\n%s", id, out)
		}
	}
	final := rounds()
	t.Logf("%d kills of lazyd; reader rounds completed per sandbox: %v; creates %d tried, %d failed", kills, final, createsTried.Load(), createsFailed.Load())
	t.Logf("kill -> new lazyd serving: %v", restartTook)
	t.Logf("kill -> every reader served again (two rounds): %v", backTook)
	log, _ := os.ReadFile(filepath.Join(p.DataDir, "layers", "lazy", "lazyd.log"))
	if n := strings.Count(string(log), "resumed the FUSE connection"); n < kills+1 {
		t.Errorf("lazyd.log says the connection was resumed %d times after %d kills", n, kills+1)
	}
	t.Logf("kills after which the kernel resent requests the dead lazyd had taken: %d", strings.Count(string(log), "answering requests the previous lazyd left"))

	// Nothing left: with no sandbox and corral stopped, lazyd and its keeper exit and unmount.
	for _, id := range ids {
		if _, err := p.Client.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	p.Stop()
	eventually(t, 20*time.Second, "lazyd and its keeper to exit", func() bool {
		return len(lazydPids(p.DataDir)) == 0 && len(lazydKeeperPids(p.DataDir)) == 0
	})
	assertNoLeftovers(t, p)
}

// lazydAnswers reports whether a lazyd answers on the data dir's control socket.
func lazydAnswers(dataDir string) bool {
	sock := filepath.Join(dataDir, "layers", "lazy", "lazyd.sock")
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	resp, err := c.Get("http://lazyd/v1/info")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
