package corral_test

import (
	"io"
	"strings"
	"testing"

	corral "github.com/corral-dev/corral/sdk/go"
	"github.com/corral-dev/corral/sdk/go/corraltest"
)

func TestFork(t *testing.T) {
	srv := corraltest.NewServer(t)
	c := srv.Client()
	ctx := testContext(t)
	src, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: corraltest.DefaultBase, Runtime: "gvisor", Labels: map[string]string{"a": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, src.ID, "/root/f", strings.NewReader("kept"), corral.WriteFileOptions{}); err != nil {
		t.Fatal(err)
	}
	copies, err := c.Fork(ctx, src.ID, corral.ForkRequest{Count: 2, Labels: map[string]string{"b": "2"}})
	if err != nil {
		t.Fatalf("Fork: %v", err)
	}
	if len(copies) != 2 {
		t.Fatalf("Fork made %d copies, want 2", len(copies))
	}
	body := lastBody(t, srv)
	if body["count"] != float64(2) {
		t.Errorf("request body %v, want count 2", body)
	}
	for _, cp := range copies {
		if cp.ForkedFrom != src.ID || cp.State != corral.StateRunning || cp.Labels["a"] != "1" || cp.Labels["b"] != "2" {
			t.Errorf("copy %+v: want running, forked_from %s, labels a=1 b=2", cp, src.ID)
		}
		r, err := c.ReadFile(ctx, cp.ID, "/root/f")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r)
		r.Close()
		if string(b) != "kept" {
			t.Errorf("copy %s: /root/f = %q", cp.ID, b)
		}
	}
	if _, err := c.Fork(ctx, src.ID, corral.ForkRequest{Count: corral.MaxForkCount + 1}); !corral.IsInvalid(err) {
		t.Errorf("fork of %d copies: %v, want invalid", corral.MaxForkCount+1, err)
	}
	plain, err := c.CreateSandbox(ctx, corral.CreateRequest{Base: corraltest.DefaultBase})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fork(ctx, plain.ID, corral.ForkRequest{}); !corral.IsConflict(err) {
		t.Errorf("fork of a runc sandbox without disk_only: %v, want conflict", err)
	}
	if _, err := c.Fork(ctx, plain.ID, corral.ForkRequest{DiskOnly: true}); err != nil {
		t.Errorf("disk-only fork of a runc sandbox: %v", err)
	}
	if _, err := c.DeleteSandbox(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fork(ctx, src.ID, corral.ForkRequest{}); !corral.IsConflict(err) {
		t.Errorf("fork of a deleted sandbox: %v, want conflict", err)
	}
}
