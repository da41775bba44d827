package e2e

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corral "github.com/corral-dev/corral/sdk/go"
)

// TestFilesMove moves files inside a real sandbox: rename(2)'s semantics, refusals that name
// what is wrong, and no way out of the sandbox's root through the paths.
func TestFilesMove(t *testing.T) { forRuntimes(t, testFilesMove) }

func testFilesMove(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	ctx := context.Background()
	sb := p.create(corral.CreateRequest{})
	escaped := "/escaped-" + randHex(6)
	p.sh(sb.ID, "mkdir -p /work/sub /work/full/x && echo hello > /work/a && echo old > /work/sub/b && "+
		"ln -s /proc/1/root /work/proc && ln -s ../../../../../../../.. /work/up")

	// A file replaces another, as rename(2) does.
	fi, err := p.Client.Move(ctx, sb.ID, "/work/a", "/work/sub/b")
	if err != nil {
		t.Fatalf("Move: %v", err)
	}
	if fi.Path != "/work/sub/b" || fi.Name != "b" || fi.Size != 6 || fi.IsDir {
		t.Errorf("Move = %+v", fi)
	}
	if got := p.sh(sb.ID, "cat /work/sub/b; test -e /work/a && echo still there || true"); got != "hello\n" {
		t.Errorf("after the move: %q", got)
	}
	// A directory, with its contents.
	if fi, err := p.Client.Move(ctx, sb.ID, "/work/full", "/work/sub/full"); err != nil || !fi.IsDir {
		t.Errorf("moving a directory: %+v, %v", fi, err)
	}
	if got := p.sh(sb.ID, "ls /work/sub/full"); got != "x\n" {
		t.Errorf("moved directory holds %q", got)
	}

	for _, tt := range []struct {
		name     string
		src, dst string
		is       func(error) bool
		field    string
		msg      string
	}{
		{"relative destination", "/work/sub/b", "../../etc/x", corral.IsInvalid, "destination", "absolute"},
		{"missing source", "/work/nope", "/work/c", corral.IsNotFound, "", "no such file"},
		{"missing parent", "/work/sub/b", "/work/no/c", corral.IsNotFound, "", "parent directory"},
		{"another mount", "/work/sub/b", "/dev/shm/b", corral.IsInvalid, "destination", "different mounts"},
		{"over a non-empty directory", "/work/sub/full", "/work", corral.IsConflict, "", ""},
		{"into itself", "/work/sub", "/work/sub/full/in", corral.IsInvalid, "destination", "into itself"},
		{"through /proc/1/root", "/work/sub/b", "/work/proc/etc/x", corral.IsInvalid, "destination", "/proc"},
		{"a directory of a layer", "/workspace", "/work/ws", corral.IsInvalid, "source", "in place"},
	} {
		_, err := p.Client.Move(ctx, sb.ID, tt.src, tt.dst)
		var apiErr *corral.APIError
		if !tt.is(err) || !errors.As(err, &apiErr) || apiErr.Field != tt.field || !strings.Contains(apiErr.Message, tt.msg) {
			t.Errorf("%s: Move %s %s: %v (field %q), want field %q and %q", tt.name, tt.src, tt.dst, err, fieldOf(err), tt.field, tt.msg)
		}
	}
	if got := p.sh(sb.ID, "cat /work/sub/b; ls -A /dev/shm | wc -l; test -e /etc/x && echo moved || true"); got != "hello\n0\n" {
		t.Errorf("a refused move changed something: %q", got)
	}

	// A symbolic link that climbs out leads to the sandbox's own root, never the host's.
	if _, err := p.Client.Move(ctx, sb.ID, "/work/sub/b", "/work/up"+escaped); err != nil {
		t.Fatalf("Move through a climbing link: %v", err)
	}
	if got := p.sh(sb.ID, "cat "+escaped); got != "hello\n" {
		t.Errorf("%s in the sandbox holds %q", escaped, got)
	}
	if _, err := os.Lstat(escaped); !errors.Is(err, os.ErrNotExist) {
		os.Remove(escaped)
		t.Errorf("the move reached the host's %s: %v", escaped, err)
	}

	// Moving is using the sandbox: a read-only token may not.
	tok, err := p.Client.CreateToken(ctx, corral.TokenRequest{Project: "/", Permissions: []string{corral.PermSandboxRead}})
	if err != nil {
		t.Fatal(err)
	}
	viewer := corral.New(p.URL, tok.Token)
	_, err = viewer.Move(ctx, sb.ID, escaped, "/work/z")
	if apiErr, ok := errors.AsType[*corral.APIError](err); !ok || apiErr.Status != 403 || apiErr.Permission != corral.PermSandboxUse {
		t.Errorf("move with sandbox.read only: %v, want 403 naming sandbox.use", err)
	}
	if _, err := viewer.Watch(ctx, sb.ID, "/work", false); !corral.IsDenied(err) {
		t.Errorf("watch with sandbox.read only: %v, want denied", err)
	}

	// The move is in the trajectory.
	steps, err := p.Client.Trajectory(ctx, sb.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	moves := 0
	for _, s := range steps {
		if s.Kind == "move" {
			moves++
		}
	}
	if moves == 0 {
		t.Errorf("no move in the trajectory %+v", steps)
	}
}

func fieldOf(err error) string {
	if e, ok := errors.AsType[*corral.APIError](err); ok {
		return e.Field
	}
	return ""
}

// TestFilesWatch watches a directory of a real sandbox recursively while a command changes it.
func TestFilesWatch(t *testing.T) { forRuntimes(t, testFilesWatch) }

func testFilesWatch(t *testing.T, rt string) {
	p := withBaseOn(t, rt)
	sb := p.create(corral.CreateRequest{})
	p.sh(sb.ID, "mkdir -p /work/w/old")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ws, err := p.Client.Watch(ctx, sb.ID, "/work/w", true)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer ws.Close()
	events := make(chan corral.WatchEvent, 1024)
	var streamErr error
	go func() {
		defer close(events)
		for {
			ev, err := ws.Next()
			if err != nil {
				streamErr = err
				return
			}
			events <- ev
		}
	}()
	var seen []string
	// expect reads events until want has appeared in order (other events may come between).
	expect := func(want ...string) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for len(want) > 0 {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("watch ended (%v) before %q; saw %q", streamErr, want, seen)
				}
				line := ev.Type + " " + ev.Name
				seen = append(seen, line)
				if line == want[0] {
					want = want[1:]
				}
			case <-timeout:
				t.Fatalf("no %q within 30s; saw %q", want, seen)
			}
		}
	}

	p.sh(sb.ID, "cd /work/w && echo hi > f && echo more >> f && mv f g && chmod 600 g && "+
		"mkdir -p new/deeper && echo x > new/deeper/h && rm g && touch old/o")
	expect("create f", "write f", "rename f", "rename g", "chmod g", "create new",
		"create new/deeper/h", "remove g", "create old/o")
	// A directory made earlier in the watch is watched too.
	p.sh(sb.ID, "echo y > /work/w/new/deeper/later")
	expect("create new/deeper/later", "write new/deeper/later")
	// Removing the directory ends the watch: its contents' removes, its own, then the end.
	p.sh(sb.ID, "rm -rf /work/w")
	expect("remove old/o", "remove ")
	for ev := range events {
		seen = append(seen, ev.Type+" "+ev.Name)
	}
	if streamErr != io.EOF {
		t.Errorf("watch of a removed directory ended with %v, want io.EOF; saw %q", streamErr, seen)
	}
	for _, line := range seen {
		if strings.Contains(line, "overflow") {
			t.Errorf("overflow in a slow stream: %q", seen)
		}
	}

	// A pause: gVisor's checkpoint closes the agent's connections, which ends the watch with an
	// error; runc's freeze keeps it, and changes after the resume arrive.
	p.sh(sb.ID, "mkdir -p /work/p")
	pw, err := p.Client.Watch(ctx, sb.ID, "/work/p", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Client.PauseSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if rt == "gvisor" {
		if ev, err := pw.Next(); err == nil || err == io.EOF {
			t.Errorf("watch across a gVisor pause: %+v, %v; want an error", ev, err)
		}
	}
	if _, err := p.Client.ResumeSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if rt == "runc" {
		p.sh(sb.ID, "touch /work/p/after")
		if ev, err := pw.Next(); err != nil || ev.Type != corral.WatchCreate || ev.Name != "after" {
			t.Errorf("watch across a runc pause: %+v, %v; want the create after the resume", ev, err)
		}
	}
	pw.Close()

	if _, err := p.Client.Watch(ctx, sb.ID, "/work/nope", false); !corral.IsNotFound(err) {
		t.Errorf("watch of a missing directory: %v, want not found", err)
	}
	// At most 8 watches at once per sandbox; the refusal says so.
	p.sh(sb.ID, "mkdir -p /work/v")
	var open []*corral.WatchStream
	defer func() {
		for _, w := range open {
			w.Close()
		}
	}()
	eventually(t, 10*time.Second, "8 watches open", func() bool {
		if w, err := p.Client.Watch(ctx, sb.ID, "/work/v", false); err == nil {
			open = append(open, w)
		}
		return len(open) == 8
	})
	if _, err := p.Client.Watch(ctx, sb.ID, "/work/v", false); !corral.IsExhausted(err) || !strings.Contains(err.Error(), "8 watches") {
		t.Errorf("ninth watch: %v, want exhausted naming the limit of 8", err)
	}

	// Deleting the sandbox ends its watches with an error.
	if _, err := p.Client.DeleteSandbox(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := open[0].Next()
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || err == io.EOF || !slices.Contains([]string{corral.CodeUnavailable, corral.CodeInternal}, codeOf(err)) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("watch of a deleted sandbox ended with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("watch still open 30s after its sandbox was deleted")
	}
}

func codeOf(err error) string {
	if e, ok := errors.AsType[*corral.APIError](err); ok {
		return e.Code
	}
	return ""
}
