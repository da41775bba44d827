package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/store"
)

// MinDataDirFree is the free space corral up wants on its data dir's filesystem to start: its
// store, lock, logs of sandboxes and layer mounts are written there from the first second.
const MinDataDirFree = 64 << 20

// checkDataDirFS refuses a data dir that corral up cannot keep its state in: on a read-only
// filesystem, or one with less than MinDataDirFree free. It runs before anything is written.
func checkDataDirFS(dir string) error {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return fmt.Errorf("check data dir %s: %w", dir, err)
	}
	if fs.Flags&unix.ST_RDONLY != 0 {
		return fmt.Errorf("data dir %s is on a read-only filesystem: corral up keeps its state there; remount it read-write or choose another --data-dir", dir)
	}
	if free := int64(fs.Bavail) * fs.Bsize; free < MinDataDirFree {
		return fmt.Errorf("data dir %s has %d MiB free on its filesystem, corral up needs at least %d MiB there to start: free some space or choose another --data-dir",
			dir, free>>20, MinDataDirFree>>20)
	}
	return nil
}

// ownerSetting is the store's record of the Corral that owns it: an ID that the owner's data dir
// keeps too (ownerFile), and that data dir's path, for messages.
const ownerSetting = "corral.owner"

// ownerFile, in the data dir, holds the ID of the store it belongs with.
const ownerFile = "store.owner"

type storeOwner struct {
	ID      string `json:"id"`
	DataDir string `json:"data_dir"`
}

// checkStoreOwner refuses a store that belongs to another Corral (another data dir's), and a
// data dir that belongs with another store: either would make this Corral adopt, or tear down
// as unknown, sandboxes that are not its own. The first start of a data dir with a new store
// makes them each other's; a data dir and store from before owners were recorded are paired
// at their next start. Nothing is written unless the pair checks out.
func checkStoreOwner(ctx context.Context, st *store.Store, dataDir, storeName string) error {
	var rec storeOwner
	b, err := st.GetSetting(ctx, ownerSetting)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
	case err != nil:
		return fmt.Errorf("read the store's owner: %w", err)
	default:
		if err := json.Unmarshal(b, &rec); err != nil || rec.ID == "" {
			return fmt.Errorf("read the store's owner: %q is not an owner record", b)
		}
	}
	path := filepath.Join(dataDir, ownerFile)
	fb, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read the data dir's store owner: %w", err)
	}
	mine := strings.TrimSpace(string(fb))
	switch {
	case rec.ID != "" && mine == rec.ID:
		return nil
	case rec.ID != "" && mine == "" && rec.DataDir != dataDir:
		return fmt.Errorf("store %s belongs to another Corral (data dir %s): give this data dir its own store (--store), or start that Corral; nothing was changed",
			storeName, rec.DataDir)
	case rec.ID != "" && mine != "":
		return fmt.Errorf("store %s belongs to another Corral (data dir %s), and data dir %s to another store: give --store the store this data dir was used with; nothing was changed",
			storeName, rec.DataDir, dataDir)
	case rec.ID == "" && mine != "":
		return fmt.Errorf("data dir %s was used with another store than %s (this one has no owner: a new or another database): give --store the store this data dir was used with; nothing was changed",
			dataDir, storeName)
	}
	if rec.ID == "" {
		// A new pair, or one from before owners: the store first, so that a crash before the
		// file is written leaves a store that names this data dir (and is recognised above).
		var r [16]byte
		rand.Read(r[:])
		rec = storeOwner{ID: hex.EncodeToString(r[:]), DataDir: dataDir}
		doc, _ := json.Marshal(rec)
		if err := st.PutSetting(ctx, ownerSetting, doc); err != nil {
			return fmt.Errorf("record the store's owner: %w", err)
		}
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(rec.ID+"\n"), 0o600); err != nil {
		return fmt.Errorf("record the data dir's store: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("record the data dir's store: %w", err)
	}
	return nil
}

// redactDSN is a store's DSN fit for messages: a PostgreSQL URL without its password (a
// key=value DSN, which may hold one anywhere, not at all).
func redactDSN(dsn string) string {
	if !store.IsPostgres(dsn) {
		return dsn
	}
	u, err := url.Parse(dsn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "(a PostgreSQL DSN)"
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}
