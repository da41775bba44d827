// Package versitygw runs versitygw, a real S3 server, with its posix backend over a local
// directory on a free 127.0.0.1 port, with random root credentials: the S3 of the tests
// (blobstore/s3test) and of `corral bench lazy`. The binary is built and cached by
// scripts/install-versitygw.sh.
package versitygw

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Version is the versitygw expected. Keep in step with scripts/install-versitygw.sh, which
// builds it into the cache where Find looks.
const Version = "v1.8.0"

// Region is the region the server and its clients use.
const Region = "us-east-1"

// ErrNotFound says no versitygw binary was found.
var ErrNotFound = errors.New("versitygw not found")

// Find returns the versitygw binary: $CORRAL_VERSITYGW, then the install script's cache
// ($CORRAL_CACHE, default /var/cache/corral), then PATH.
func Find() (string, error) {
	if p := os.Getenv("CORRAL_VERSITYGW"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("CORRAL_VERSITYGW: %w", err)
		}
		return p, nil
	}
	cache := os.Getenv("CORRAL_CACHE")
	if cache == "" {
		cache = "/var/cache/corral"
	}
	p := filepath.Join(cache, "versitygw", Version, "versitygw")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("versitygw %s not found at $CORRAL_VERSITYGW, %s or in PATH: run scripts/install-versitygw.sh: %w", Version, p, ErrNotFound)
}

// Server is a running versitygw.
type Server struct {
	Endpoint string // http://127.0.0.1:port
	Access   string // root access key
	Secret   string // root secret

	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs bin over dir/data (created) with its logs in dir, and creates buckets. Stop ends it.
func Start(ctx context.Context, bin, dir string, buckets ...string) (*Server, error) {
	data := filepath.Join(dir, "data") // posix needs the directory to exist
	if err := os.Mkdir(data, 0o700); err != nil {
		return nil, err
	}
	s := &Server{Access: RandomHex(10), Secret: RandomHex(20)}
	// The free port may be taken again before versitygw binds it; try a few.
	for attempt := 1; ; attempt++ {
		addr, err := FreeAddr()
		if err != nil {
			return nil, err
		}
		logPath := filepath.Join(dir, fmt.Sprintf("versitygw-%d.log", attempt))
		ok, err := s.run(ctx, bin, addr, data, logPath)
		if err != nil {
			return nil, err
		}
		if ok {
			s.Endpoint = "http://" + addr
			break
		}
		if attempt == 3 {
			b, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("versitygw did not start; its output:\n%s", b)
		}
	}
	c, err := s.Client()
	if err != nil {
		s.Stop()
		return nil, err
	}
	for _, b := range buckets {
		if err := c.MakeBucket(ctx, b, minio.MakeBucketOptions{Region: Region}); err != nil {
			s.Stop()
			return nil, fmt.Errorf("make bucket %s: %w", b, err)
		}
	}
	return s, nil
}

// Client returns a path-style client with the root credentials.
func (s *Server) Client() (*minio.Client, error) {
	u, err := url.Parse(s.Endpoint)
	if err != nil {
		return nil, err
	}
	return minio.New(u.Host, &minio.Options{Creds: credentials.NewStaticV4(s.Access, s.Secret, ""), Region: Region, BucketLookup: minio.BucketLookupPath})
}

// run starts versitygw on addr and waits until it answers HTTP; false if it exited first (the
// port was taken).
func (s *Server) run(ctx context.Context, bin, addr, data, logPath string) (bool, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return false, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "--port", addr, "--quiet", "posix", data)
	// Credentials by environment, not flags, as a real deployment would keep them out of ps.
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+s.Access, "ROOT_SECRET_KEY="+s.Secret, "GOMAXPROCS=2")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return false, fmt.Errorf("start %s: %w", bin, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-done:
			s.cmd = nil
			return false, nil
		default:
		}
		// Any HTTP answer (403 without credentials) means it is serving.
		if resp, err := hc.Get("http://" + addr + "/"); err == nil {
			resp.Body.Close()
			return true, nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			b, _ := os.ReadFile(logPath)
			return false, fmt.Errorf("versitygw on %s did not answer in 10 s; its output:\n%s", addr, b)
		}
		select {
		case <-ctx.Done():
			s.Stop()
			return false, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop ends the server (SIGTERM, then SIGKILL after 5 s).
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		s.cmd.Process.Kill()
		<-s.done
	}
	s.cmd = nil
}

// FreeAddr returns a 127.0.0.1 address with a port nobody listens on now.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// RandomHex returns n random bytes in hex.
func RandomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
