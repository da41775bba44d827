package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/store"
)

// TestCheckStoreOwner: a data dir and a new store become each other's; each refuses the other's
// partner; a store recorded for this data dir whose file was never written (a crash between the
// two writes) is taken back; a refusal writes nothing.
func TestCheckStoreOwner(t *testing.T) {
	ctx := context.Background()
	open := func(path string) *store.Store {
		t.Helper()
		st, err := store.Open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	a, b := t.TempDir(), t.TempDir()
	sa, sb := open(filepath.Join(a, "corral.db")), open(filepath.Join(b, "corral.db"))
	if err := checkStoreOwner(ctx, sa, a, "A"); err != nil {
		t.Fatalf("first start of a: %v", err)
	}
	if err := checkStoreOwner(ctx, sa, a, "A"); err != nil {
		t.Fatalf("second start of a: %v", err)
	}
	if err := checkStoreOwner(ctx, sb, b, "B"); err != nil {
		t.Fatalf("first start of b: %v", err)
	}
	for _, c := range []struct {
		st        *store.Store
		name, dir string
		want      string
	}{
		{sa, "A", b, "store A belongs to another Corral (data dir " + a + ")"},
		{sb, "B", a, "store B belongs to another Corral (data dir " + b + ")"},
		{open(filepath.Join(t.TempDir(), "new.db")), "N", a, "data dir " + a + " was used with another store than N"},
	} {
		if err := checkStoreOwner(ctx, c.st, c.dir, c.name); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("checkStoreOwner(%s, %s) = %v; want %q", c.name, c.dir, err, c.want)
		}
	}
	fresh := t.TempDir()
	if err := checkStoreOwner(ctx, sa, fresh, "A"); err == nil {
		t.Fatal("a fresh data dir was given another Corral's store")
	}
	if _, err := os.Stat(filepath.Join(fresh, ownerFile)); !os.IsNotExist(err) {
		t.Fatalf("a refused check wrote the data dir's owner file: %v", err)
	}
	// The crash window: the store names the data dir, the file is missing.
	os.Remove(filepath.Join(a, ownerFile))
	if err := checkStoreOwner(ctx, sa, a, "A"); err != nil {
		t.Fatalf("a store recorded for this data dir, its file lost: %v", err)
	}
}

func TestRedactDSN(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://corral:s3cret@db:5432/corral?sslmode=disable": "postgres://corral:xxxxx@db:5432/corral?sslmode=disable",
		"postgres://db/corral": "postgres://db/corral",
		"/var/lib/corral/x.db": "/var/lib/corral/x.db",
	} {
		if got := redactDSN(in); got != want {
			t.Errorf("redactDSN(%q) = %q, want %q", in, got, want)
		}
	}
}
