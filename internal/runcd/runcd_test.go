package runcd

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// serveOne answers one connection on sock with answer(request, stdio, extras).
func serveOne(t *testing.T, sock string, answer func(Request, *os.File, []*os.File, error) Reply) {
	t.Helper()
	lis, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		conn, err := lis.AcceptUnix()
		if err != nil {
			return
		}
		defer conn.Close()
		req, stdio, extra, err := ReadRequest(conn)
		WriteReply(conn, answer(req, stdio, extra, err))
	}()
}

func TestRoundTrip(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s")
	serveOne(t, sock, func(req Request, stdio *os.File, extra []*os.File, err error) Reply {
		if err != nil {
			return Reply{Error: err.Error()}
		}
		// The files arrive in order: stdio first, then the extras, as open descriptors.
		stdio.WriteString("to stdio")
		extra[1].WriteString("to the second extra")
		if req.ID != "sb-1" || req.Root != "/run/r" || req.Bundle != "/b" || len(extra) != 2 {
			return Reply{Error: "unexpected request"}
		}
		return Reply{Pid: 4242}
	})
	dir := t.TempDir()
	var files []*os.File
	for _, n := range []string{"stdio", "x0", "x1"} {
		f, err := os.Create(filepath.Join(dir, n))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		files = append(files, f)
	}
	pid, err := Run(context.Background(), sock, Request{Root: "/run/r", ID: "sb-1", Bundle: "/b"}, files[0], files[1:])
	if err != nil || pid != 4242 {
		t.Fatalf("Run = %d, %v; want 4242", pid, err)
	}
	for n, want := range map[string]string{"stdio": "to stdio", "x1": "to the second extra"} {
		if b, _ := os.ReadFile(filepath.Join(dir, n)); string(b) != want {
			t.Errorf("%s holds %q, want %q", n, b, want)
		}
	}
}

func TestErrors(t *testing.T) {
	ctx := context.Background()
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	t.Run("nothing listens", func(t *testing.T) {
		_, err := Run(ctx, filepath.Join(t.TempDir(), "none"), Request{ID: "x"}, f, nil)
		if !strings.Contains(err.Error(), ErrUnreachable.Error()) {
			t.Errorf("Run to no socket: %v, want %v", err, ErrUnreachable)
		}
	})
	t.Run("the engine's error", func(t *testing.T) {
		sock := filepath.Join(t.TempDir(), "s")
		serveOne(t, sock, func(Request, *os.File, []*os.File, error) Reply { return Reply{Error: "runc init: no /proc"} })
		if _, err := Run(ctx, sock, Request{ID: "x"}, f, nil); err == nil || err.Error() != "runc init: no /proc" {
			t.Errorf("Run = %v, want the engine's error as it is", err)
		}
	})
	t.Run("files and count disagree", func(t *testing.T) {
		sock := filepath.Join(t.TempDir(), "s")
		got := make(chan error, 1)
		serveOne(t, sock, func(_ Request, _ *os.File, _ []*os.File, err error) Reply {
			got <- err
			return Reply{Error: "refused"}
		})
		conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		b, _ := json.Marshal(Request{ID: "x", Extra: 3})
		if _, _, err := conn.WriteMsgUnix(b, unix.UnixRights(int(f.Fd())), nil); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err == nil || !strings.Contains(err.Error(), "names 3 extra files and carries 1") {
			t.Errorf("ReadRequest = %v, want the mismatch refused", err)
		}
	})
}
