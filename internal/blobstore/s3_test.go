//go:build linux

package blobstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/blobstore/s3test"
	"github.com/corral-dev/corral/internal/errdefs"
)

func s3Backend(srv *s3test.Server) backend {
	var n atomic.Int64
	return backend{
		// Each store is a fresh prefix of the one bucket, which also shows that a store sees
		// nothing outside its prefix.
		open: func(t *testing.T) Store {
			s, err := Open(t.Context(), srv.Spec(s3test.Bucket, fmt.Sprintf("t%d/store", n.Add(1)), "&access_key_file="+srv.KeyFile))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		leftovers: func(t *testing.T, s Store) []string {
			st := s.(*s3Store)
			var out []string
			for up := range st.client.ListIncompleteUploads(t.Context(), st.bucket, st.prefix, true) {
				if up.Err != nil {
					t.Fatalf("list incomplete uploads: %v", up.Err)
				}
				out = append(out, "incomplete upload of "+up.Key)
			}
			return out
		},
	}
}

func TestS3(t *testing.T) {
	srv := s3test.Start(t)
	t.Run("Conformance", func(t *testing.T) { testConformance(t, s3Backend(srv)) })

	t.Run("String", func(t *testing.T) {
		s, err := Open(t.Context(), srv.Spec(s3test.Bucket, "p/q", "&access_key_file="+srv.KeyFile))
		if err != nil {
			t.Fatal(err)
		}
		want := "s3://corral-test/p/q?endpoint=" + srv.Endpoint + "&region=us-east-1"
		if got := s.String(); got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	})

	t.Run("WrongCredentials", func(t *testing.T) {
		for name, keys := range map[string]string{
			"WrongSecret":    srv.Access + "\nwrong-secret\n",
			"UnknownAccess":  "nobody\n" + srv.Secret + "\n",
			"BothWrong":      "nobody\nwrong-secret",
			"TrailingSpaces": srv.Access + "  \r\n" + srv.Secret + "x\r\n",
		} {
			file := filepath.Join(t.TempDir(), "keys")
			if err := os.WriteFile(file, []byte(keys), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Open(t.Context(), srv.Spec(s3test.Bucket, "", "&access_key_file="+file))
			if !errors.Is(err, errdefs.ErrDenied) || !strings.Contains(err.Error(), "refused the credentials") ||
				!strings.Contains(err.Error(), srv.Endpoint) {
				t.Errorf("%s: Open error = %v, want ErrDenied saying %s refused the credentials", name, err, srv.Endpoint)
			}
			if strings.Contains(fmt.Sprint(err), srv.Secret) {
				t.Errorf("%s: Open error shows the secret: %v", name, err)
			}
		}
	})

	t.Run("MissingBucket", func(t *testing.T) {
		_, err := Open(t.Context(), srv.Spec("no-such-bucket", "", "&access_key_file="+srv.KeyFile))
		if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), `bucket "no-such-bucket" does not exist`) {
			t.Errorf("Open error = %v, want ErrNotFound saying the bucket does not exist", err)
		}
	})

	t.Run("BadKeyFile", func(t *testing.T) {
		dir := t.TempDir()
		for name, content := range map[string]string{"one-line": "access\n", "three-lines": "a\nb\nc\n", "empty-secret": "a\n \n"} {
			file := filepath.Join(dir, name)
			if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Open(t.Context(), srv.Spec(s3test.Bucket, "", "&access_key_file="+file))
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), file) {
				t.Errorf("%s: Open error = %v, want ErrInvalid naming the file", name, err)
			}
		}
		_, err := Open(t.Context(), srv.Spec(s3test.Bucket, "", "&access_key_file="+filepath.Join(dir, "missing")))
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("missing key file: Open error = %v, want ErrInvalid", err)
		}
	})

	t.Run("EnvironmentCredentials", func(t *testing.T) {
		t.Setenv("AWS_SESSION_TOKEN", "")
		t.Setenv("AWS_ACCESS_KEY_ID", srv.Access)
		t.Setenv("AWS_SECRET_ACCESS_KEY", srv.Secret)
		s, err := Open(t.Context(), srv.Spec(s3test.Bucket, "env", ""))
		if err != nil {
			t.Fatal(err)
		}
		mustPut(t, s, "k", []byte("v"), true)
		checkContent(t, s, "k", []byte("v"))

		t.Setenv("AWS_SECRET_ACCESS_KEY", "")
		if _, err := Open(t.Context(), srv.Spec(s3test.Bucket, "env", "")); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "AWS_ACCESS_KEY_ID") {
			t.Errorf("Open without credentials: error = %v, want ErrInvalid saying how to give them", err)
		}
	})

	t.Run("Unreachable", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		dead := "http://" + s3test.FreeAddr(t)
		_, err := Open(ctx, "s3://"+s3test.Bucket+"?endpoint="+dead+"&access_key_file="+srv.KeyFile)
		if err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(dead, "http://")) {
			t.Errorf("Open of a dead endpoint: error = %v, want one naming it", err)
		}
		if !errors.Is(err, errdefs.ErrUnavailable) {
			t.Errorf("Open of a dead endpoint: error = %v, want ErrUnavailable", err)
		}
	})
}
