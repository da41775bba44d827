// Package pgtest runs a throwaway PostgreSQL cluster for tests: Debian's PostgreSQL binaries
// (installed by scripts/setup.sh), a data directory in a temp dir, loopback only, durability off
// (fsync, synchronous commit) since nothing outlives the test binary. Each test gets a database
// of its own.
//
// The cluster starts on the first call to NewDB and stops when the test binary's TestMain calls
// Stop. Tests skip, saying why, where PostgreSQL is not installed.
package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
)

var (
	once    sync.Once
	cluster *instance
	initErr error
	skipWhy string
	dbSeq   atomic.Int64
)

type instance struct {
	dir, bin, port string
	asUser         []string // command prefix running a binary as the cluster's owner
	admin          *sql.DB
}

// NewDB creates an empty database on the shared cluster and returns its URL; the database is
// dropped when the test ends.
func NewDB(t testing.TB) string {
	t.Helper()
	once.Do(func() { cluster, initErr = start() })
	if skipWhy != "" {
		t.Skip(skipWhy)
	}
	if initErr != nil {
		t.Fatalf("start PostgreSQL: %v", initErr)
	}
	name := fmt.Sprintf("t%d_%d", os.Getpid(), dbSeq.Add(1))
	if _, err := cluster.admin.Exec(`CREATE DATABASE ` + name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		cluster.admin.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`)
	})
	return cluster.url(name)
}

func (c *instance) url(db string) string {
	return "postgres://postgres@127.0.0.1:" + c.port + "/" + db + "?sslmode=disable"
}

// Stop stops the cluster, if one was started, and removes its files.
func Stop() {
	if cluster == nil {
		return
	}
	cluster.admin.Close()
	cmd := exec.Command(cluster.asUser[0], append(cluster.asUser[1:], filepath.Join(cluster.bin, "pg_ctl"), "stop", "-D", filepath.Join(cluster.dir, "data"), "-m", "immediate", "-w")...)
	cmd.Run()
	os.RemoveAll(cluster.dir)
	cluster = nil
}

// binDir finds the newest installed PostgreSQL's binaries.
func binDir() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d
		}
	}
	return ""
}

func start() (*instance, error) {
	bin := binDir()
	if bin == "" {
		skipWhy = "PostgreSQL is not installed (scripts/setup.sh installs Debian's postgresql)"
		return nil, nil
	}
	c := &instance{bin: bin}
	dir, err := os.MkdirTemp("", "corral-pg-")
	if err != nil {
		return nil, err
	}
	c.dir = dir
	// PostgreSQL refuses to run as root: as root, the cluster belongs to the postgres user.
	c.asUser = []string{"env"}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			skipWhy = "running as root and there is no postgres user to own the test cluster (scripts/setup.sh installs postgresql, which creates it)"
			return nil, nil
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
		c.asUser = []string{"runuser", "-u", "postgres", "--"}
	}
	run := func(name string, args ...string) error {
		cmd := exec.Command(c.asUser[0], append(c.asUser[1:], append([]string{filepath.Join(bin, name)}, args...)...)...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %v: %s", name, err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	data := filepath.Join(dir, "data")
	if err := run("initdb", "-D", data, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c.port = strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	opts := "-c listen_addresses=127.0.0.1 -p " + c.port + " -k " + dir +
		" -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 -c shared_buffers=64MB"
	if err := run("pg_ctl", "start", "-D", data, "-w", "-t", "30", "-l", filepath.Join(dir, "log"), "-o", opts); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		os.RemoveAll(dir)
		return nil, fmt.Errorf("%v\n%s", err, log)
	}
	c.admin, err = sql.Open("pgx", c.url("postgres"))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.admin.PingContext(ctx); err != nil {
		return nil, err
	}
	return c, nil
}
