package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/corral-dev/corral/internal/daemon"
	"github.com/corral-dev/corral/internal/store"
)

// The E2B gateway of a cluster (corral server --e2b-listen): every replica serves it, so they
// share its secrets through the store — the key envd access tokens are derived from, and the
// service token the in-sandbox surface acts with.
const (
	e2bKeySetting     = "e2b.key"
	e2bServiceSetting = "e2b.service-token"
)

// e2bSecrets returns the gateway's key and service token, making them the first time (replicas
// racing agree on the first stored) and minting a new service token when an operator revoked it.
func e2bSecrets(ctx context.Context, st *store.Store, log *slog.Logger) ([]byte, string, error) {
	key, err := sharedKey(ctx, st, e2bKeySetting)
	if err != nil {
		return nil, "", err
	}
	var service string
	if err := readSetting(ctx, st, e2bServiceSetting, &service); err == nil && daemon.E2BServiceTokenValid(ctx, st, service) {
		return key, service, nil
	}
	// None yet, or revoked: mint one. Two replicas doing so at once each store theirs; the last
	// write wins and the other's token is unused (revocable by an operator).
	service, err = daemon.MintE2BServiceToken(ctx, st, log)
	if err != nil {
		return nil, "", err
	}
	doc, _ := json.Marshal(service)
	if err := st.PutSetting(ctx, e2bServiceSetting, doc); err != nil {
		return nil, "", err
	}
	return key, service, nil
}

// sharedKey returns the 32-byte key the replicas share under setting, made by the first
// replica that asks (the store keeps the first one written).
func sharedKey(ctx context.Context, st *store.Store, setting string) ([]byte, error) {
	var b [32]byte
	rand.Read(b[:])
	doc, _ := json.Marshal(hex.EncodeToString(b[:]))
	if _, err := st.PutSettingIfAbsent(ctx, setting, doc); err != nil {
		return nil, err
	}
	var keyHex string
	if err := readSetting(ctx, st, setting, &keyHex); err != nil {
		return nil, err
	}
	key, err := hex.DecodeString(keyHex)
	if err != nil {
		return nil, fmt.Errorf("decode setting %s: %w", setting, err)
	}
	return key, nil
}

func readSetting(ctx context.Context, st *store.Store, key string, v any) error {
	raw, err := st.GetSetting(ctx, key)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("decode setting %s: %w", key, err)
	}
	return nil
}
