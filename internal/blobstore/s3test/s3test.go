// Package s3test starts a real S3 server for tests: versitygw (built and cached by
// scripts/install-versitygw.sh) with its posix backend over a temporary directory, on a free
// 127.0.0.1 port, with random root credentials and one bucket.
package s3test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// VersitygwVersion is the versitygw the tests expect. Keep in step with
// scripts/install-versitygw.sh, which builds it into the cache where findVersitygw looks.
const VersitygwVersion = "v1.8.0"

// Bucket is the bucket each test server starts with.
const Bucket = "corral-test"

// Region is the region the server and the specs use.
const Region = "us-east-1"

// findVersitygw returns the versitygw binary: $CORRAL_VERSITYGW, then the install script's cache,
// then PATH. It skips the test when there is none.
func findVersitygw(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("CORRAL_VERSITYGW"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("CORRAL_VERSITYGW: %v", err)
		}
		return p
	}
	cache := os.Getenv("CORRAL_CACHE")
	if cache == "" {
		cache = "/var/cache/corral"
	}
	p := filepath.Join(cache, "versitygw", VersitygwVersion, "versitygw")
	if _, err := os.Stat(p); err == nil {
		return p
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	t.Skipf("versitygw %s not found at $CORRAL_VERSITYGW, %s or in PATH: run scripts/install-versitygw.sh", VersitygwVersion, p)
	return ""
}

// Server is a versitygw serving a posix directory on 127.0.0.1.
type Server struct {
	Endpoint string // http://127.0.0.1:port
	KeyFile  string // access key and secret, for access_key_file=
	Access   string
	Secret   string
}

// Start starts versitygw with its posix backend over a fresh directory, with a random
// root access key and secret, and creates Bucket. The server stops when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := findVersitygw(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "data") // posix needs the directory to exist
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	srv := &Server{KeyFile: filepath.Join(dir, "keys"), Access: RandomHex(10), Secret: RandomHex(20)}
	if err := os.WriteFile(srv.KeyFile, []byte(srv.Access+"\n"+srv.Secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The free port may be taken again before versitygw binds it; try a few.
	for attempt := 1; ; attempt++ {
		addr := FreeAddr(t)
		log := filepath.Join(dir, fmt.Sprintf("versitygw-%d.log", attempt))
		if runVersitygw(t, bin, addr, data, srv, log) {
			srv.Endpoint = "http://" + addr
			break
		}
		b, _ := os.ReadFile(log)
		if attempt == 3 {
			t.Fatalf("versitygw did not start; its output:\n%s", b)
		}
		t.Logf("versitygw on %s did not start, retrying; its output:\n%s", addr, b)
	}
	u, _ := url.Parse(srv.Endpoint)
	admin, err := minio.New(u.Host, &minio.Options{Creds: credentials.NewStaticV4(srv.Access, srv.Secret, ""), Region: Region, BucketLookup: minio.BucketLookupPath})
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.MakeBucket(context.Background(), Bucket, minio.MakeBucketOptions{Region: Region}); err != nil {
		t.Fatalf("make bucket %s: %v", Bucket, err)
	}
	return srv
}

// runVersitygw starts versitygw on addr and waits until it answers HTTP. It reports false if the
// process exited first (the port was taken).
func runVersitygw(t testing.TB, bin, addr, data string, srv *Server, logPath string) bool {
	t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, "--port", addr, "--quiet", "posix", data)
	// Credentials by environment, not flags, as a real deployment would keep them out of ps.
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+srv.Access, "ROOT_SECRET_KEY="+srv.Secret, "GOMAXPROCS=2")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	stop := func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}
	client := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case <-exited:
			return false
		case <-deadline:
			stop()
			b, _ := os.ReadFile(logPath)
			t.Fatalf("versitygw on %s did not answer in 10s; its output:\n%s", addr, b)
		case <-tick.C:
		}
		// Any HTTP answer (403 without credentials) means it is serving.
		if resp, err := client.Get("http://" + addr + "/"); err == nil {
			resp.Body.Close()
			t.Cleanup(stop)
			return true
		}
	}
}

// FreeAddr returns a 127.0.0.1 address with a port nobody listens on now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// RandomHex returns n random bytes in hex.
func RandomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Spec returns the store spec for prefix in bucket on srv, with extra query parameters appended.
func (srv *Server) Spec(bucket, prefix, extra string) string {
	s := "s3://" + bucket
	if prefix != "" {
		s += "/" + prefix
	}
	return s + "?endpoint=" + srv.Endpoint + "&region=" + Region + extra
}
