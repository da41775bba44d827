package e2e

import (
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/blobstore/s3test"
	corral "github.com/corral-dev/corral/sdk/go"
)

// cutProxy forwards TCP connections to target until cut: then it refuses new ones and drops the
// open ones, as a blob store that became unreachable would.
type cutProxy struct {
	ln    net.Listener
	cut   atomic.Bool
	mu    sync.Mutex
	conns map[net.Conn]bool
}

func startCutProxy(t *testing.T, target string) *cutProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); p.setCut(true) })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if p.cut.Load() {
				c.Close()
				continue
			}
			go p.serve(c, target)
		}
	}()
	return p
}

func (p *cutProxy) serve(c net.Conn, target string) {
	up, err := net.Dial("tcp", target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	go func() { io.Copy(up, c); up.Close() }()
	io.Copy(c, up)
	c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

func (p *cutProxy) setCut(cut bool) {
	p.cut.Store(cut)
	if cut {
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	}
}

// layerStats runs `corral layer stats REF -o json` on p.
func (p *corralProc) layerStats(ref string) corral.LayerStats {
	p.t.Helper()
	out, errOut, code := p.cli("", "layer", "stats", ref, "-o", "json")
	if code != 0 {
		p.t.Fatalf("corral layer stats %s: %s", ref, errOut)
	}
	var st corral.LayerStats
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.Fetch == nil {
		p.t.Fatalf("corral layer stats %s -o json: %v: %s", ref, err, out)
	}
	return st
}

// createCLI runs `corral create ARGS -o json` on p and returns the sandbox.
func (p *corralProc) createCLI(args ...string) corral.Sandbox {
	p.t.Helper()
	out, errOut, code := p.cli("", append(append([]string{"create"}, args...), "-o", "json")...)
	if code != 0 {
		p.t.Fatalf("corral create %v: %s", args, errOut)
	}
	var sb corral.Sandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil {
		p.t.Fatalf("corral create -o json: %v: %s", err, out)
	}
	return sb
}

// TestLazyLayerData: layers in an S3 blob store (a real versitygw) reach nodes as metadata plus
// data fetched in chunks. Importing writes only to the blob store; a lazy sandbox fetches what it
// reads; eager fetches everything before the sandbox starts; prefetch on a cold node fetches what
// another node's sandbox of the same environment read at start; a blob store that stops answering
// fails reads with EIO after the timeout and the mount recovers; lazyd outlives a kill -9 of
// corral up, and nothing is left once every node stops.
func TestLazyLayerData(t *testing.T) {
	needRoot(t)
	srv := s3test.Start(t)
	spec := srv.Spec(s3test.Bucket, "lazy", "&access_key_file="+srv.KeyFile)
	a := startCorral(t, "--blob-store", spec)
	// Public: only public versions reach the other Corrals of the blob store.
	shared := corral.ImportOptions{Public: true}
	a.importDirWith(a.Client, "base", "1", corral.KindBase, busyboxRootfs(t), shared)
	tk := t.TempDir()
	big := make([]byte, 12<<20)
	rand.Read(big)
	bigSum := md5.Sum(big)
	os.MkdirAll(filepath.Join(tk, "opt/tk/small"), 0o755)
	os.WriteFile(filepath.Join(tk, "opt/tk/big"), big, 0o644)
	for i := range 40 {
		os.WriteFile(filepath.Join(tk, "opt/tk/small", fmt.Sprintf("f%02d", i)), fmt.Appendf(nil, "small file %d\n", i), 0o644)
	}
	a.importDirWith(a.Client, "tk", "1", corral.KindToolkit, tk, shared)
	if st := a.layerStats("tk:1"); st.Format != "erofs-split" || st.Fetch.CachedBytes != 0 || st.DataBytes < int64(len(big)) {
		t.Fatalf("after import on the importing node: format %s, %d bytes cached of %d; want erofs-split with nothing cached", st.Format, st.Fetch.CachedBytes, st.DataBytes)
	}

	// A node reaching the blob store through a proxy the test can cut.
	proxy := startCutProxy(t, strings.TrimPrefix(srv.Endpoint, "http://"))
	bSpec := strings.Replace(spec, srv.Endpoint, "http://"+proxy.ln.Addr().String(), 1)
	b := startCorral(t, "--blob-store", bSpec, "--fetch-timeout", "3s")
	sb := b.createCLI("--base", "base:1", "--toolkit", "tk:1", "--fetch", "lazy")
	if sb.Fetch != "lazy" {
		t.Errorf("sandbox view fetch = %q, want lazy", sb.Fetch)
	}
	if out := strings.TrimSpace(b.sh(sb.ID, "cat /opt/tk/small/f07")); out != "small file 7" {
		t.Fatalf("small file in a lazy sandbox = %q", out)
	}
	st := b.layerStats("tk:1")
	if st.Fetch.BytesFetched == 0 || st.Fetch.CachedBytes >= st.DataBytes/2 {
		t.Fatalf("reading one small file: %d bytes fetched, %d of %d cached; want a little", st.Fetch.BytesFetched, st.Fetch.CachedBytes, st.DataBytes)
	}
	ctx := context.Background()
	if fs, err := b.Client.FetchStats(ctx, sb.ID); err != nil || fs.BytesRead == 0 {
		t.Errorf("sandbox fetch stats = %+v, %v; want the sandbox's reads counted", fs, err)
	}

	// The blob store stops answering: a read of data not yet fetched fails with EIO within the
	// timeout (3 s, plus retries already in flight), metadata still works, and once the store is
	// back the same read succeeds.
	proxy.setCut(true)
	start := time.Now()
	_, errOut, exit := b.run(sb.ID, "md5sum", "/opt/tk/big")
	if exit == nil || exit.Code == 0 || !strings.Contains(errOut, "Input/output error") {
		t.Fatalf("reading unfetched data with the store down: exit %+v, stderr %q; want an I/O error", exit, errOut)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the failing read took %s with a 3 s fetch timeout", took)
	}
	if out := b.sh(sb.ID, "ls /opt/tk/small | wc -l"); strings.TrimSpace(out) != "40" {
		t.Errorf("listing with the store down = %q", out)
	}
	if fs, _ := b.Client.FetchStats(ctx, sb.ID); fs.ReadErrors == 0 || fs.LastError == "" {
		t.Errorf("sandbox fetch stats after the outage = %+v; want read errors and the last error", fs)
	}
	// The node's metrics say it too.
	req, _ := http.NewRequest("GET", b.URL+"/v1/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+b.Token)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Error(err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{`corral_chunk_cache_bytes{node="local"} `, `corral_layer_read_errors_total{node="local",layer="`} {
			if !strings.Contains(string(body), want) {
				t.Errorf("metrics lack %s:\n%s", want, body)
			}
		}
		if strings.Contains(string(body), `corral_layer_read_errors_total{node="local",layer="`) && !regexp.MustCompile(`corral_layer_read_errors_total\{node="local",layer="[0-9a-f]+"\} [1-9]`).Match(body) {
			t.Errorf("metrics count no read error after the outage:\n%s", body)
		}
	}
	proxy.setCut(false)

	// kill -9 of corral up: lazyd serves on, the restarted corral up finds it, and the sandbox
	// reads the rest of the toolkit.
	b.Kill9()
	b.Restart()
	if out := strings.Fields(b.sh(sb.ID, "md5sum /opt/tk/big")); len(out) == 0 || out[0] != hex.EncodeToString(bigSum[:]) {
		t.Fatalf("big file after a kill -9 of corral up: %v", out)
	}
	// Deleting the sandbox saves its start-up profile to the blob store.
	if _, err := b.Client.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}

	// Eager on a cold node: everything is cached before the create returns.
	c := startCorral(t, "--blob-store", spec)
	sbc := c.createCLI("--base", "base:1", "--toolkit", "tk:1", "--fetch", "eager")
	if st := c.layerStats("tk:1"); st.Fetch.CachedBytes != st.DataBytes {
		t.Errorf("eager create returned with %d of %d bytes cached", st.Fetch.CachedBytes, st.DataBytes)
	}
	if out := strings.Fields(c.sh(sbc.ID, "md5sum /opt/tk/big")); len(out) == 0 || out[0] != hex.EncodeToString(bigSum[:]) {
		t.Errorf("big file in an eager sandbox: %v", out)
	}

	// Prefetch on another cold node: the profile node b recorded is fetched without a read.
	d := startCorral(t, "--blob-store", spec)
	d.createCLI("--base", "base:1", "--toolkit", "tk:1", "--fetch", "prefetch")
	eventually(t, 10*time.Second, "prefetch of the recorded start-up set", func() bool {
		st := d.layerStats("tk:1")
		return st.Fetch.Prefetch.Chunks > 0 && st.Fetch.CachedBytes > 0
	})

	// A layer's own fill rate: a prefetch sandbox's node then fetches all of it in the
	// background (here a layer no sandbox has read yet, so nothing comes from a profile).
	tk2 := t.TempDir()
	more := make([]byte, 6<<20)
	rand.Read(more)
	os.WriteFile(filepath.Join(tk2, "more"), more, 0o644)
	a.importDirWith(a.Client, "tk", "2", corral.KindToolkit, tk2, shared)
	if _, errOut, code := d.cli("", "layer", "set", "tk:2", "--fill-rate", "64M"); code != 0 {
		t.Fatalf("corral layer set: %s", errOut)
	}
	d.createCLI("--base", "base:1", "--toolkit", "tk:2")
	var last corral.LayerStats
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if last = d.layerStats("tk:2"); last.Fetch.CachedBytes == last.DataBytes && last.Fetch.FillBytes > 0 {
			break
		}
	}
	if last.Fetch.CachedBytes != last.DataBytes || last.Fetch.FillBytes == 0 {
		b, _ := os.ReadFile(filepath.Join(d.DataDir, "layers/lazy/lazyd.log"))
		t.Fatalf("background fill at 64M/s: %+v; lazyd log:\n%s", *last.Fetch, b)
	}

	// Every node stops: no lazyd and no FUSE mount is left (the harness's cleanup checks).
	for _, p := range []*corralProc{a, b, c, d} {
		p.cleanup()
		if pids := lazydPids(p.DataDir); len(pids) > 0 {
			t.Errorf("lazyd %v still runs for %s after corral up stopped with no sandbox", pids, p.DataDir)
		}
	}
}

// lazydPids lists the lazyd processes serving dataDir.
func lazydPids(dataDir string) []string { return procsOf(dataDir, "lazyd") }

// lazydKeeperPids lists the keepers of lazyd's FUSE connection (`corral lazyd-keeper`) of the
// data dir.
func lazydKeeperPids(dataDir string) []string { return procsOf(dataDir, "lazyd-keeper") }

// procsOf lists the processes running `corral <sub> --dir <dataDir>/...`.
func procsOf(dataDir, sub string) []string {
	var pids []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 3 && args[1] == sub && strings.HasPrefix(args[3], dataDir+"/") {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// TestLingerYieldsCache: a layer left mounted after its last sandbox (--layer-linger) keeps its
// chunks pinned in lazyd's cache; an eager create that needs the room unmounts the lingering
// layers and starts, where it would otherwise fail with the cache full.
func TestLingerYieldsCache(t *testing.T) {
	needRoot(t)
	p := startCorral(t, "--cache-size", "64M", "--layer-linger", "5m") // the least lazyd takes
	p.importDir("base", "1", corral.KindBase, busyboxRootfs(t))
	for _, name := range []string{"tka", "tkb"} {
		dir := t.TempDir()
		data := make([]byte, 36<<20) // one fits beside the base, two do not
		rand.Read(data)
		os.MkdirAll(filepath.Join(dir, "opt", name), 0o755)
		os.WriteFile(filepath.Join(dir, "opt", name, "data"), data, 0o644)
		p.importDir(name, "1", corral.KindToolkit, dir)
	}
	ctx := context.Background()
	a := p.createCLI("--base", "base:1", "--toolkit", "tka:1", "--fetch", "eager")
	if _, err := p.Client.DeleteSandbox(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	waitEnded(t, p.Client, a.ID)
	if !strings.Contains(p.Logs(), "mounted erofs image") || strings.Contains(p.Logs(), "unmounted erofs image") {
		t.Fatalf("tka:1 should linger mounted after its sandbox ended:\n%s", p.Logs())
	}
	b := p.createCLI("--base", "base:1", "--toolkit", "tkb:1", "--fetch", "eager")
	if out := strings.TrimSpace(p.sh(b.ID, "wc -c < /opt/tkb/data")); out != strconv.Itoa(36<<20) {
		t.Errorf("tkb's data in the sandbox: %q bytes", out)
	}
	if !strings.Contains(p.Logs(), "chunk cache full: unmounted lingering layers") {
		t.Errorf("the create did not make room by unmounting lingering layers:\n%s", p.Logs())
	}
}
