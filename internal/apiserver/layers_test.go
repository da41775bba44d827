package apiserver

import (
	"testing"

	"github.com/corral-dev/corral/internal/iam"
	"github.com/corral-dev/corral/internal/model"
	"github.com/corral-dev/corral/internal/store"
)

// TestCanReadLayer: who sees a layer in listings and gets. A token sees the layers of projects
// it holds layer.read on, and those visible from its own project (iam.LayerVisible); the root's
// layers reach a tenant only when public, whatever the tenant's role.
func TestCanReadLayer(t *testing.T) {
	owner, _ := iam.RolePerms(model.RoleOwner)
	viewer, _ := iam.RolePerms(model.RoleViewer)
	as := func(project string, perms iam.Perm) *caller {
		return &caller{tok: &store.TokenRecord{ProjectPath: project, Perms: perms}, held: map[string]iam.Perm{project: perms}}
	}
	root, a, sub, b := as("", owner), as("a", owner), as("a/sub", viewer), as("b", owner)
	noRead := as("b", iam.SandboxUse)
	layer := func(project string, private, public bool) model.Layer {
		return model.Layer{Name: "l", Version: "1", Project: iam.Display(project), Private: private, Public: public}
	}
	for _, c := range []struct {
		name string
		c    *caller
		l    model.Layer
		want bool
	}{
		{"root sees a's", root, layer("a", true, false), true},
		{"a sees its own", a, layer("a", false, false), true},
		{"a sees a/sub's (held there)", a, layer("a/sub", true, false), true},
		{"a/sub sees a's", sub, layer("a", false, false), true},
		{"a/sub does not see a's private one", sub, layer("a", true, false), false},
		{"b does not see a's", b, layer("a", false, false), false},
		{"b sees a's public one", b, layer("a", false, true), true},
		{"b does not see the root's", b, layer("", false, false), false},
		{"a/sub does not see the root's", sub, layer("", false, false), false},
		{"b sees the root's public one", b, layer("", false, true), true},
		{"without layer.read nothing", noRead, layer("", false, true), false},
		{"a layer of no known project", root, model.Layer{Project: "Not A Path"}, false},
	} {
		if got := c.c.canReadLayer(c.l); got != c.want {
			t.Errorf("%s: canReadLayer = %v, want %v", c.name, got, c.want)
		}
	}
}
