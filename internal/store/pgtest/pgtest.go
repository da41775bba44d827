// Package pgtest runs a throwaway PostgreSQL cluster for tests: Debian's PostgreSQL binaries
// (installed by scripts/setup.sh), a data directory in a temp dir, loopback only, durability off
// (fsync, synchronous commit) since nothing outlives the test binary. Each test gets a database
// of its own.
//
// The shared cluster starts on the first call to NewDB and stops when the test binary's TestMain
// calls Stop. Tests skip, saying why, where PostgreSQL is not installed. A test (or benchmark)
// that needs a cluster of its own (other listen addresses, a restart) starts one with Start.
package pgtest

import (
	"context"
	"database/sql"
	"errors"
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
	cluster *Cluster
	initErr error
	dbSeq   atomic.Int64
)

// Cluster is one throwaway PostgreSQL cluster.
type Cluster struct {
	dir, bin, port, opts string
	asUser               []string // command prefix running a binary as the cluster's owner
	admin                *sql.DB
	host                 string // the address in URLs
}

// ErrNotInstalled is returned by Start where PostgreSQL (or its postgres user) is missing.
var ErrNotInstalled = errors.New("PostgreSQL is not installed (scripts/setup.sh installs Debian's postgresql)")

// NewDB creates an empty database on the shared cluster and returns its URL; the database is
// dropped when the test ends.
func NewDB(t testing.TB) string {
	t.Helper()
	once.Do(func() { cluster, initErr = Start() })
	if errors.Is(initErr, ErrNotInstalled) {
		t.Skip(initErr.Error())
	}
	if initErr != nil {
		t.Fatalf("start PostgreSQL: %v", initErr)
	}
	url, err := cluster.CreateDB(fmt.Sprintf("t%d_%d", os.Getpid(), dbSeq.Add(1)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cluster.DropDB(url) })
	return url
}

// CreateDB creates an empty database and returns its URL.
func (c *Cluster) CreateDB(name string) (string, error) {
	if _, err := c.admin.Exec(`CREATE DATABASE ` + name); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return c.url(name), nil
}

// DropDB drops the database at url (one CreateDB returned), even while it is in use.
func (c *Cluster) DropDB(url string) {
	name := strings.TrimPrefix(url[strings.LastIndex(url, "/"):strings.Index(url, "?")], "/")
	c.admin.Exec(`DROP DATABASE IF EXISTS ` + name + ` WITH (FORCE)`)
}

func (c *Cluster) url(db string) string {
	return "postgres://postgres@" + net.JoinHostPort(c.host, c.port) + "/" + db + "?sslmode=disable"
}

// Sessions returns how many sessions role has open on the cluster (pg_stat_activity).
func (c *Cluster) Sessions(role string) (int, error) {
	var n int
	err := c.admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE usename = $1`, role).Scan(&n)
	return n, err
}

// Stop stops the shared cluster, if one was started, and removes its files.
func Stop() {
	if cluster != nil {
		cluster.Stop()
		cluster = nil
	}
}

// Stop stops the cluster at once (connections are cut) and removes its files.
func (c *Cluster) Stop() {
	c.admin.Close()
	c.pgctl("stop", "-m", "immediate")
	os.RemoveAll(c.dir)
}

// Restart stops the cluster at once, as a crash would, and starts it again on the same port
// and data: every open connection is cut.
func (c *Cluster) Restart() error {
	if err := c.pgctl("stop", "-m", "immediate"); err != nil {
		return err
	}
	return c.pgctl("start", "-t", "30", "-l", filepath.Join(c.dir, "log"), "-o", c.opts)
}

// RestartFast restarts the cluster as an operator's restart or a failover does: connections are
// cut, but what was committed is kept (a crash loses the last commits here, since the cluster
// runs with synchronous_commit off).
func (c *Cluster) RestartFast() error {
	if err := c.pgctl("stop", "-m", "fast"); err != nil {
		return err
	}
	return c.pgctl("start", "-t", "30", "-l", filepath.Join(c.dir, "log"), "-o", c.opts)
}

func (c *Cluster) pgctl(args ...string) error {
	args = append([]string{args[0], "-D", filepath.Join(c.dir, "data"), "-w"}, args[1:]...)
	return c.run("pg_ctl", args...)
}

func (c *Cluster) run(name string, args ...string) error {
	cmd := exec.Command(c.asUser[0], append(c.asUser[1:], append([]string{filepath.Join(c.bin, name)}, args...)...)...)
	cmd.Dir = c.dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
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

// Start starts a cluster of its own listening on the given addresses (127.0.0.1 when none; URLs
// name the first), trusting every connection: keep the addresses to loopback or a test's own
// network. Stop it when done.
func Start(listen ...string) (*Cluster, error) {
	if len(listen) == 0 {
		listen = []string{"127.0.0.1"}
	}
	bin := binDir()
	if bin == "" {
		return nil, ErrNotInstalled
	}
	c := &Cluster{bin: bin, host: listen[0]}
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
			os.RemoveAll(dir)
			return nil, fmt.Errorf("running as root and there is no postgres user to own the cluster: %w", ErrNotInstalled)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
		c.asUser = []string{"runuser", "-u", "postgres", "--"}
	}
	data := filepath.Join(dir, "data")
	if err := c.run("initdb", "-D", data, "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// Clients on the other addresses (a test's network namespaces) are trusted too.
	hba := "host all all 0.0.0.0/0 trust\n"
	if err := appendFile(filepath.Join(data, "pg_hba.conf"), hba); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c.port = strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	c.opts = "-c listen_addresses=" + strings.Join(listen, ",") + " -p " + c.port + " -k " + dir +
		" -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300 -c shared_buffers=64MB"
	if err := c.pgctl("start", "-t", "30", "-l", filepath.Join(dir, "log"), "-o", c.opts); err != nil {
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
		c.Stop()
		return nil, err
	}
	return c, nil
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
