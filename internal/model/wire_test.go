package model_test

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/model"
	corral "github.com/corral-dev/corral/sdk/go"
)

// check type-checks the Go package in dir (its files without tests) from source.
func check(t *testing.T, dir string) *types.Package {
	t.Helper()
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, n, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	pkg, err := conf.Check(filepath.Base(dir), fset, files, nil)
	if err != nil {
		t.Fatalf("type-check %s: %v", dir, err)
	}
	return pkg
}

// TestWireShape holds the server's own types (this package) and the SDK's to one JSON shape:
// every type here has the SDK's type of its name with the same fields in the same order, the
// same JSON tags and field types of the same shape, and every constant here has the SDK's value.
// The server decodes requests into these types and encodes answers from them, so a field one
// side gains and the other lacks would be dropped, refused or never sent; this test names it.
func TestWireShape(t *testing.T) {
	ours := check(t, ".")
	sdk := check(t, filepath.Join("..", "..", "sdk", "go"))
	c := comparer{ours: ours, sdk: sdk, seen: map[[2]types.Type]bool{}}
	n := 0
	for _, name := range ours.Scope().Names() {
		obj := ours.Scope().Lookup(name)
		if !obj.Exported() {
			continue
		}
		theirs := sdk.Scope().Lookup(name)
		if theirs == nil {
			t.Errorf("%s: the SDK has no %s (a type of the API's wire is in both)", name, name)
			continue
		}
		switch obj := obj.(type) {
		case *types.TypeName:
			if err := c.same(obj.Type(), theirs.Type(), name); err != nil {
				t.Error(err)
			}
			n++
		case *types.Const:
			tc, ok := theirs.(*types.Const)
			if !ok || !constant.Compare(obj.Val(), token.EQL, tc.Val()) {
				t.Errorf("constant %s is %v here and %v in the SDK", name, obj.Val(), theirs)
			}
			if err := c.same(obj.Type(), theirs.Type(), name); err != nil {
				t.Error(err)
			}
		case *types.Var:
			if err := c.same(obj.Type(), theirs.Type(), name); err != nil {
				t.Error(err)
			}
		}
	}
	if n < 80 {
		t.Fatalf("compared %d types; want the whole API's", n)
	}
}

// TestVarsMatch checks the values of this package's variables against the SDK's; TestWireShape
// has checked their types, and vars lists every exported variable here, so a new one is added to it.
func TestVarsMatch(t *testing.T) {
	vars := map[string][2]any{"EventTypes": {model.EventTypes, corral.EventTypes}}
	ours := check(t, ".")
	for _, name := range ours.Scope().Names() {
		if v, ok := ours.Scope().Lookup(name).(*types.Var); ok && v.Exported() {
			if _, listed := vars[name]; !listed {
				t.Errorf("variable %s is not in TestVarsMatch's list: add it, with the SDK's", name)
			}
		}
	}
	for name, pair := range vars {
		if !reflect.DeepEqual(pair[0], pair[1]) {
			t.Errorf("%s differs:\nhere %v\nSDK  %v", name, pair[0], pair[1])
		}
	}
}

type comparer struct {
	ours, sdk *types.Package
	seen      map[[2]types.Type]bool
}

// same reports how a (a type of ours) and b (the SDK's) differ in shape, at path.
func (c comparer) same(a, b types.Type, path string) error {
	if c.seen[[2]types.Type{a, b}] {
		return nil
	}
	c.seen[[2]types.Type{a, b}] = true
	na, aNamed := a.(*types.Named)
	nb, bNamed := b.(*types.Named)
	if aNamed != bNamed {
		return fmt.Errorf("%s: %s here, %s in the SDK", path, a, b)
	}
	if aNamed {
		oa, ob := na.Obj(), nb.Obj()
		ours, theirs := oa.Pkg() == c.ours, ob.Pkg() == c.sdk
		if ours != theirs || oa.Name() != ob.Name() {
			return fmt.Errorf("%s: %s here, %s in the SDK", path, a, b)
		}
		if !ours { // a type of a third package (time.Time, json.RawMessage) or error
			if pkgPath(oa) != pkgPath(ob) {
				return fmt.Errorf("%s: %s here, %s in the SDK", path, a, b)
			}
			return nil
		}
	}
	a, b = a.Underlying(), b.Underlying()
	switch a := a.(type) {
	case *types.Basic:
		if b, ok := b.(*types.Basic); !ok || a.Kind() != b.Kind() {
			return fmt.Errorf("%s: %s here, %s in the SDK", path, a, b)
		}
	case *types.Pointer:
		if b, ok := b.(*types.Pointer); ok {
			return c.same(a.Elem(), b.Elem(), path+"*")
		}
		return fmt.Errorf("%s: %s here, %s in the SDK", path, a, b)
	case *types.Slice:
		if b, ok := b.(*types.Slice); ok {
			return c.same(a.Elem(), b.Elem(), path+"[]")
		}
		return fmt.Errorf("%s: %s here, %s in the SDK", path, a, b)
	case *types.Array:
		if b, ok := b.(*types.Array); ok && a.Len() == b.Len() {
			return c.same(a.Elem(), b.Elem(), path+"[n]")
		}
		return fmt.Errorf("%s: %s here, %s in the SDK", path, a, b)
	case *types.Map:
		if b, ok := b.(*types.Map); ok {
			if err := c.same(a.Key(), b.Key(), path+"[key]"); err != nil {
				return err
			}
			return c.same(a.Elem(), b.Elem(), path+"[value]")
		}
		return fmt.Errorf("%s: %s here, %s in the SDK", path, a, b)
	case *types.Interface:
		if b, ok := b.(*types.Interface); !ok || !a.Empty() || !b.Empty() {
			return fmt.Errorf("%s: %s here, %s in the SDK (wire types hold no interfaces but any)", path, a, b)
		}
	case *types.Struct:
		bs, ok := b.(*types.Struct)
		if !ok {
			return fmt.Errorf("%s: %s here, %s in the SDK", path, a, b)
		}
		for i := 0; i < max(a.NumFields(), bs.NumFields()); i++ {
			if i >= a.NumFields() {
				return fmt.Errorf("%s: the SDK has field %s (json %q), this package does not", path, bs.Field(i).Name(), jsonName(bs.Tag(i)))
			}
			if i >= bs.NumFields() {
				return fmt.Errorf("%s: this package has field %s (json %q), the SDK does not", path, a.Field(i).Name(), jsonName(a.Tag(i)))
			}
			fa, fb := a.Field(i), bs.Field(i)
			if fa.Name() != fb.Name() || fa.Embedded() != fb.Embedded() || a.Tag(i) != bs.Tag(i) {
				return fmt.Errorf("%s: field %d is %s `%s` here, %s `%s` in the SDK", path, i, fa.Name(), a.Tag(i), fb.Name(), bs.Tag(i))
			}
			if err := c.same(fa.Type(), fb.Type(), path+"."+fa.Name()); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("%s: %s is no wire type", path, a)
	}
	return nil
}

func pkgPath(o *types.TypeName) string {
	if o.Pkg() == nil {
		return ""
	}
	return o.Pkg().Path()
}

func jsonName(tag string) string { return reflect.StructTag(tag).Get("json") }
