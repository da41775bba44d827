// Package s3test starts a real S3 server for tests: versitygw (internal/blobstore/versitygw,
// built and cached by scripts/install-versitygw.sh) with its posix backend over a temporary
// directory, on a free 127.0.0.1 port, with random root credentials and one bucket.
package s3test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/internal/blobstore/versitygw"
)

// VersitygwVersion is the versitygw the tests expect (versitygw.Version).
const VersitygwVersion = versitygw.Version

// Bucket is the bucket each test server starts with.
const Bucket = "corral-test"

// Region is the region the server and the specs use.
const Region = versitygw.Region

// Server is a versitygw serving a posix directory on 127.0.0.1.
type Server struct {
	Endpoint string // http://127.0.0.1:port
	KeyFile  string // access key and secret, for access_key_file=
	Access   string
	Secret   string
}

// Start starts versitygw with its posix backend over a fresh directory, with a random root
// access key and secret, and creates Bucket. The server stops when the test ends. The test is
// skipped when no versitygw is installed.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := versitygw.Find()
	if errors.Is(err, versitygw.ErrNotFound) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	vg, err := versitygw.Start(context.Background(), bin, dir, Bucket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(vg.Stop)
	srv := &Server{Endpoint: vg.Endpoint, KeyFile: filepath.Join(dir, "keys"), Access: vg.Access, Secret: vg.Secret}
	if err := os.WriteFile(srv.KeyFile, []byte(srv.Access+"\n"+srv.Secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return srv
}

// FreeAddr returns a 127.0.0.1 address with a port nobody listens on now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := versitygw.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// RandomHex returns n random bytes in hex.
func RandomHex(n int) string { return versitygw.RandomHex(n) }

// Spec returns the store spec for prefix in bucket on srv, with extra query parameters appended.
func (srv *Server) Spec(bucket, prefix, extra string) string {
	s := "s3://" + bucket
	if prefix != "" {
		s += "/" + prefix
	}
	return s + "?endpoint=" + srv.Endpoint + "&region=" + Region + extra
}
