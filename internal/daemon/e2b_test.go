package daemon

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/store"
)

// TestMintE2BServiceToken: the E2B gateway's first token creates its principal (a service in
// the root project, granted the user role there); a second one reuses it; both are valid and
// may read and use sandboxes only.
func TestMintE2BServiceToken(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "corral.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	log := slog.New(slog.DiscardHandler)
	for i := range 2 {
		secret, err := MintE2BServiceToken(ctx, st, log)
		if err != nil {
			t.Fatalf("mint %d: %v", i, err)
		}
		if !E2BServiceTokenValid(ctx, st, secret) {
			t.Errorf("mint %d: the token is not valid", i)
		}
	}
	p, err := st.GetPrincipal(ctx, e2bPrincipal)
	if err != nil || p.Kind != iam.KindService || p.CreatedBy != store.RootPrincipal {
		t.Fatalf("the gateway's principal: %+v, %v", p, err)
	}
	grants, err := st.PrincipalGrants(ctx, e2bPrincipal, "")
	if err != nil || len(grants) != 1 || grants[0].Role != iam.RoleUser {
		t.Fatalf("its grants: %+v, %v", grants, err)
	}
	toks, err := st.ListTokens(ctx, store.TokenFilter{Principal: e2bPrincipal})
	if err != nil || len(toks) != 2 {
		t.Fatalf("its tokens: %d, %v", len(toks), err)
	}
	for _, tok := range toks {
		if tok.Perms != iam.SandboxRead|iam.SandboxUse || tok.Role != iam.RoleUser {
			t.Errorf("token %s: perms %v, role %q", tok.ID, tok.Perms, tok.Role)
		}
	}
}
