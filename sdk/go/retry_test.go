package corral_test

import (
	"bytes"
	"crypto/sha256"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// flaky answers the first fails requests with status (and Retry-After when retryAfter is set),
// then 200 with a sandbox; it counts requests and checks that a repeated body arrives whole.
func flaky(t *testing.T, fails int, status int, retryAfter string) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method == http.MethodPost && len(body) == 0 {
			t.Errorf("try %d arrived without its body", n.Load()+1)
		}
		if int(n.Add(1)) <= fails {
			if retryAfter != "" {
				w.Header().Set("Retry-After", retryAfter)
			}
			w.WriteHeader(status)
			io.WriteString(w, `{"code":"unavailable","message":"the store is unreachable; retry shortly"}`)
			return
		}
		io.WriteString(w, `{"id":"sb-local-1","state":"running"}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func TestRetries(t *testing.T) {
	ctx := testContext(t)
	t.Run("GET on a transient 503", func(t *testing.T) {
		srv, n := flaky(t, 2, http.StatusServiceUnavailable, "0")
		if _, err := corral.New(srv.URL, "t").GetSandbox(ctx, "sb-local-1"); err != nil || n.Load() != 3 {
			t.Fatalf("err %v after %d tries, want success on the 3rd", err, n.Load())
		}
	})
	t.Run("a 503 without Retry-After is final", func(t *testing.T) {
		srv, n := flaky(t, 5, http.StatusServiceUnavailable, "")
		if _, err := corral.New(srv.URL, "t").GetSandbox(ctx, "sb-local-1"); !corral.IsUnavailable(err) || n.Load() != 1 {
			t.Fatalf("err %v after %d tries, want unavailable after 1", err, n.Load())
		}
	})
	t.Run("create without an idempotency key is not repeated", func(t *testing.T) {
		srv, n := flaky(t, 1, http.StatusServiceUnavailable, "0")
		if _, err := corral.New(srv.URL, "t").CreateSandbox(ctx, corral.CreateRequest{Base: "b:1"}); err == nil || n.Load() != 1 {
			t.Fatalf("err %v after %d tries, want the 503 after 1", err, n.Load())
		}
	})
	t.Run("create with an idempotency key is repeated with its body", func(t *testing.T) {
		srv, n := flaky(t, 2, http.StatusBadGateway, "")
		sb, err := corral.New(srv.URL, "t").CreateSandbox(ctx, corral.CreateRequest{Base: "b:1", IdempotencyKey: "k1"})
		if err != nil || sb.ID != "sb-local-1" || n.Load() != 3 {
			t.Fatalf("%+v, %v after %d tries", sb, err, n.Load())
		}
	})
	t.Run("retries give up", func(t *testing.T) {
		srv, n := flaky(t, 100, http.StatusServiceUnavailable, "0")
		if _, err := corral.New(srv.URL, "t", corral.WithRetries(2)).GetSandbox(ctx, "x"); !corral.IsUnavailable(err) || n.Load() != 3 {
			t.Fatalf("err %v after %d tries, want unavailable after 3", err, n.Load())
		}
		n.Store(0)
		if _, err := corral.New(srv.URL, "t", corral.WithRetries(0)).GetSandbox(ctx, "x"); err == nil || n.Load() != 1 {
			t.Fatalf("WithRetries(0): %v after %d tries", err, n.Load())
		}
	})
	t.Run("a server that comes back", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close() // refused until the server below listens
		go func() {
			time.Sleep(300 * time.Millisecond)
			l, err := net.Listen("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, `{"id":"sb-local-1","state":"running"}`)
			})}
			t.Cleanup(func() { srv.Close() })
			srv.Serve(l)
		}()
		if _, err := corral.New("http://"+addr, "t").GetSandbox(ctx, "sb-local-1"); err != nil {
			t.Fatalf("GET while the server restarts: %v", err)
		}
	})
}

// TestRetryRewindsOnlyAfterTheTransport: a server that answers before it read the body leaves the
// transport still sending it; the retry must not rewind the body under the transport's feet (the
// race detector sees it) and the try that succeeds gets every byte.
func TestRetryRewindsOnlyAfterTheTransport(t *testing.T) {
	ctx := testContext(t)
	data := make([]byte, 8<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	want := sha256.Sum256(data)
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) <= 3 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"code":"unavailable","message":"later"}`)
			return
		}
		h := sha256.New()
		if _, err := io.Copy(h, r.Body); err != nil || !bytes.Equal(h.Sum(nil), want[:]) {
			t.Errorf("the try that was read got a different body (%v)", err)
		}
		io.WriteString(w, `{"path":"/f","size":8388608}`)
	}))
	t.Cleanup(srv.Close)
	c := corral.New(srv.URL, "t")
	if _, err := c.WriteFile(ctx, "sb-local-1", "/f", bytes.NewReader(data), corral.WriteFileOptions{}); err != nil || n.Load() != 4 {
		t.Fatalf("write: %v after %d tries", err, n.Load())
	}
	n.Store(0)
	if _, err := c.WriteFile(ctx, "sb-local-1", "/f", bytes.NewReader(data), corral.WriteFileOptions{Append: true}); !corral.IsUnavailable(err) || n.Load() != 1 {
		t.Fatalf("an append was repeated: %v after %d tries", err, n.Load())
	}
}
