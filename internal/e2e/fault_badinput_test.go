package e2e

import (
	"context"
	"database/sql"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver, to make another application's database

	"github.com/corral-dev/corral/internal/hostreg"
	"github.com/corral-dev/corral/internal/store/pgtest"
)

// refusedUp runs `corral up` on dataDir with extra flags, expecting it to refuse to start with a
// message containing want, and to have changed nothing: the data dir holds what it held, and the
// host registry has no claim for it.
func refusedUp(t *testing.T, dataDir, want string, extra ...string) {
	t.Helper()
	before := treeOf(dataDir)
	reg, err := hostreg.Open("")
	if err != nil {
		t.Fatal(err)
	}
	claimOf := func() (out []hostreg.Claim) {
		claims, _ := reg.List()
		for _, c := range claims {
			if c.DataDir == dataDir {
				out = append(out, c)
			}
		}
		return out
	}
	claimed := claimOf()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := append([]string{"up", "--data-dir", dataDir, "--listen", freePort(t), "--runc", runcPath(), "--no-net"}, extra...)
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "corral"), args...).CombinedOutput()
	if err == nil || ctx.Err() != nil || !strings.Contains(string(out), want) {
		t.Fatalf("corral up %v: %v; want a refusal saying %q:\n%s", extra, err, want, out)
	}
	t.Logf("refused: %s", lastLine(string(out)))
	if after := treeOf(dataDir); !slices.Equal(before, after) {
		t.Errorf("a refused start changed the data dir: %v, then %v", before, after)
	}
	if after := claimOf(); !slices.EqualFunc(claimed, after, func(a, b hostreg.Claim) bool { return a.Tag == b.Tag && a.Pool == b.Pool && a.Since.Equal(b.Since) }) {
		t.Errorf("a refused start changed the host registry's claim of the data dir: %+v, then %+v", claimed, after)
	}
}

// treeOf lists the files under dir with their sizes ("" entries for a dir that does not exist).
func treeOf(dir string) []string {
	var out []string
	filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
		if err == nil {
			fi, _ := e.Info()
			if fi != nil {
				out = append(out, path+" "+strconv.FormatInt(fi.Size(), 10))
			}
		}
		return nil
	})
	return out
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// tmpfsAt mounts a tmpfs of size on a new directory, unmounted when the test ends.
func tmpfsAt(t *testing.T, opts string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "crl-fs-")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", opts, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		syscall.Unmount(dir, syscall.MNT_DETACH)
		os.Remove(dir)
	})
	return dir
}

// TestFaultBadInput starts corral up on what it cannot or must not use: each is refused at start
// with a message saying what is wrong and what to do, and nothing is changed. A stale lock (its
// holder died) is taken over; a live one is refused.
func TestFaultBadInput(t *testing.T) {
	needRoot(t)

	t.Run("read-only data dir", func(t *testing.T) {
		fs := tmpfsAt(t, "size=16m")
		dir := filepath.Join(fs, "data")
		os.Mkdir(dir, 0o700)
		if out, err := exec.Command("mount", "-o", "remount,ro", fs).CombinedOutput(); err != nil {
			t.Fatalf("remount read-only: %v: %s", err, out)
		}
		refusedUp(t, dir, "read-only filesystem")
		refusedUp(t, filepath.Join(fs, "new"), "read-only file system") // one it would have to make
	})

	t.Run("full data dir", func(t *testing.T) {
		fs := tmpfsAt(t, "size=96m")
		dir := filepath.Join(fs, "data")
		os.Mkdir(dir, 0o700)
		fill, err := os.Create(filepath.Join(fs, "fill"))
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1<<20)
		for {
			if _, err := fill.Write(buf); err != nil {
				break // ENOSPC: full
			}
		}
		fill.Close()
		refusedUp(t, dir, "MiB free on its filesystem")
	})

	t.Run("stale and live lock", func(t *testing.T) {
		p := startCorral(t)
		pid := p.cmd.Process.Pid
		p.Kill9()
		lock, _ := os.ReadFile(filepath.Join(p.DataDir, "corral.lock"))
		if strings.TrimSpace(string(lock)) != strconv.Itoa(pid) {
			t.Fatalf("lock file after kill -9 = %q, want the dead pid %d", lock, pid)
		}
		p.Restart() // the stale lock is taken over
		if !strings.Contains(p.Logs(), "data dir lock was left by a corral up that is gone") {
			t.Errorf("corral up did not say it took over a stale lock:\n%s", p.Logs())
		}
		// A live holder is refused; the running one is untouched.
		out, err := exec.Command(filepath.Join(binDir, "corral"), "up", "--data-dir", p.DataDir, "--listen", freePort(t), "--runc", runcPath()).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "another corral up is running with data dir") {
			t.Fatalf("a second corral up on a data dir in use: %v\n%s", err, out)
		}
		if err := p.Client.Health(context.Background()); err != nil {
			t.Fatalf("the running corral after a refused second: %v", err)
		}
	})

	t.Run("another Corral's store", func(t *testing.T) {
		a := startCorral(t)
		other := t.TempDir()
		refusedUp(t, other, "belongs to another Corral (data dir "+a.DataDir+")", "--store", filepath.Join(a.DataDir, "corral.db"))
		// And the other way: a's data dir with a store that is not the one it was used with.
		a.Stop()
		refusedUp(t, a.DataDir, "was used with another store", "--store", filepath.Join(other, "new.db"))
		for _, f := range []string{"new.db", "new.db-wal", "new.db-shm"} {
			os.Remove(filepath.Join(other, f)) // SQLite made the file it then refused
		}
		a.Restart()
	})

	t.Run("another application's PostgreSQL database", func(t *testing.T) {
		dsn := pgtest.NewDB(t)
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		for _, q := range []string{
			`CREATE TABLE users (id serial PRIMARY KEY, name text)`,
			`CREATE TABLE orders (id serial PRIMARY KEY, user_id int)`,
			`CREATE TABLE schema_migrations (version bigint PRIMARY KEY, dirty boolean)`, // golang-migrate's
		} {
			if _, err := db.Exec(q); err != nil {
				t.Fatal(err)
			}
		}
		tables := func() []string {
			rows, err := db.Query(`SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY 1`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var out []string
			for rows.Next() {
				var n string
				rows.Scan(&n)
				out = append(out, n)
			}
			return out
		}
		before := tables()
		refusedUp(t, t.TempDir(), "holds tables that are not Corral's (orders, schema_migrations, users)", "--store", dsn)
		if after := tables(); !slices.Equal(before, after) {
			t.Errorf("a refused start changed the database's tables: %v, then %v", before, after)
		}
	})
}
