package store

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

// TestOpenRefusesAnotherApplicationsDatabase: a database holding tables that are not Corral's
// (a --store naming the wrong database) is refused with the tables named, and left as it was;
// an empty one, one holding only a Corral schema_migrations (a first start cut short) and
// Corral's own open.
func TestOpenRefusesAnotherApplicationsDatabase(t *testing.T) {
	drivers(t, func(t *testing.T) {
		ctx := context.Background()
		for _, c := range []struct {
			name   string
			tables []string
			refuse string // "" when Open must succeed
		}{
			{"empty", nil, ""},
			{"cut-short first start", []string{`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)`}, ""},
			{"another application", []string{`CREATE TABLE users (id INTEGER PRIMARY KEY)`, `CREATE TABLE orders (id INTEGER PRIMARY KEY)`}, "(orders, users)"},
			{"golang-migrate's schema_migrations", []string{`CREATE TABLE schema_migrations (version BIGINT PRIMARY KEY, dirty BOOLEAN)`}, "(schema_migrations)"},
		} {
			t.Run(c.name, func(t *testing.T) {
				path := dsn(t)
				driver := "sqlite"
				if IsPostgres(path) {
					driver = "pgx"
				}
				db, err := sql.Open(driver, path)
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				for _, q := range c.tables {
					if _, err := db.Exec(q); err != nil {
						t.Fatal(err)
					}
				}
				s, err := Open(ctx, path)
				if c.refuse == "" {
					if err != nil {
						t.Fatalf("Open: %v", err)
					}
					s.Close()
					s, err = Open(ctx, path) // and again, now that it is Corral's
					if err != nil {
						t.Fatalf("Open again: %v", err)
					}
					s.Close()
					return
				}
				if err == nil {
					s.Close()
					t.Fatal("Open succeeded on another application's database")
				}
				if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), c.refuse) || !strings.Contains(err.Error(), "another application") {
					t.Fatalf("Open = %v; want an invalid store naming %s", err, c.refuse)
				}
				var n int
				q := `SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'sandboxes'`
				if driver == "pgx" {
					q = `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = 'sandboxes'`
				}
				if err := db.QueryRow(q).Scan(&n); err != nil || n != 0 {
					t.Fatalf("a refused Open made Corral's tables: %d, %v", n, err)
				}
			})
		}
	})
}
