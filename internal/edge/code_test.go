package edge

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/model"
)

func TestCheckCodeRequest(t *testing.T) {
	ok := []model.CodeRequest{{Code: "1"}, {Code: "", Language: "python"}, {Code: "1", Context: "ab-12_x", Timeout: "90s"},
		{Code: "1", Env: map[string]string{"A_1": "x"}}}
	for _, req := range ok {
		if _, err := checkCodeRequest(&req); err != nil {
			t.Errorf("checkCodeRequest(%+v): %v", req, err)
		}
	}
	bad := []model.CodeRequest{{Language: "r"}, {Context: "a", Language: "python"}, {Context: "a/b"}, {Context: strings.Repeat("a", 65)},
		{Timeout: "0s"}, {Timeout: "2h"}, {Timeout: "x"}, {Env: map[string]string{"1A": "x"}}, {Env: map[string]string{"A=B": ""}}}
	for _, req := range bad {
		if _, err := checkCodeRequest(&req); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("checkCodeRequest(%+v): %v, want invalid", req, err)
		}
	}
}

func TestReadLine(t *testing.T) {
	long := strings.Repeat("x", 200)
	br := bufio.NewReaderSize(strings.NewReader("a\n"+long+"\n"+long+long+"\nlast"), 16)
	for _, want := range []string{"a\n", long + "\n"} {
		if got, err := readLine(br, 300); err != nil || string(got) != want {
			t.Fatalf("readLine = %q, %v; want %q", got, err, want)
		}
	}
	if _, err := readLine(br, 300); !errors.Is(err, errLineTooLong) {
		t.Errorf("a line over the limit: %v", err)
	}
	br = bufio.NewReader(strings.NewReader("last"))
	if got, err := readLine(br, 300); err != nil || string(got) != "last" {
		t.Errorf("an unterminated last line: %q, %v", got, err)
	}
	if _, err := readLine(br, 300); err != io.EOF {
		t.Errorf("at the end: %v, want EOF", err)
	}
}

func TestWaitReady(t *testing.T) {
	var tries, broken atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/ready" && r.URL.Query().Get("wait") == "1":
			if tries.Add(1) < 3 {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		case r.URL.Path == "/broken":
			broken.Add(1)
			w.WriteHeader(http.StatusInternalServerError)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer srv.Close()
	dial := func(ctx context.Context, port int) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
	}
	log := slog.New(slog.DiscardHandler)
	// 503 is "not yet": tried again until 2xx; a service without a check is not asked.
	waitReady(context.Background(), dial, []model.Service{{Name: "a", Port: 1, Ready: "/ready?wait=1"}, {Name: "b", Port: 2}}, log)
	if got := tries.Load(); got != 3 {
		t.Errorf("the check answered 503, 503, 200: tried %d times, want 3", got)
	}
	// Any other status is a failure: the wait ends at once.
	waitReady(context.Background(), dial, []model.Service{{Name: "c", Port: 1, Ready: "/broken"}}, log)
	if got := broken.Load(); got != 1 {
		t.Errorf("a check that answered 500: tried %d times, want 1", got)
	}
}
