package apiserver

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/lazy"
	"github.com/corral-dev/corral/internal/report"
)

// fill sets every field under v to a value no other field has, so that a conversion that drops
// or swaps a field shows.
func fill(t *testing.T, v reflect.Value, n *int) {
	t.Helper()
	*n++
	switch {
	case v.Type() == reflect.TypeFor[time.Time]():
		v.Set(reflect.ValueOf(time.Unix(int64(*n), 0).UTC()))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprint("s", *n))
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Float64:
		v.SetFloat(float64(*n) + 0.5)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range v.Len() {
			fill(t, v.Index(i), n)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			fill(t, v.Field(i), n)
		}
	default:
		t.Fatalf("fill: a field of kind %s: teach fill and the conversion about it", v.Kind())
	}
}

// leaves lists the values under v in field order, leaving out the top-level fields named skip.
func leaves(v reflect.Value, skip ...string) []any {
	if v.Type() == reflect.TypeFor[time.Time]() {
		return []any{v.Interface()}
	}
	switch v.Kind() {
	case reflect.Slice:
		var out []any
		for i := range v.Len() {
			out = append(out, leaves(v.Index(i))...)
		}
		return out
	case reflect.Struct:
		var out []any
		for i := range v.NumField() {
			if !slices.Contains(skip, v.Type().Field(i).Name) {
				out = append(out, leaves(v.Field(i))...)
			}
		}
		return out
	}
	return []any{v.Interface()}
}

// TestConversions: what an internal package hands the API reaches the wire whole, each value in
// its own field, and lazyd's control protocol stays the JSON of the API's FetchStats and
// ChunkCacheStats (the SDK's types, which lazyd spoke before it had its own: a daemon upgraded
// beside a running lazyd still reads it).
func TestConversions(t *testing.T) {
	n := 0
	var st lazy.Stats
	var cs lazy.CacheStats
	var rep report.Report
	fill(t, reflect.ValueOf(&st).Elem(), &n)
	fill(t, reflect.ValueOf(&cs).Elem(), &n)
	fill(t, reflect.ValueOf(&rep).Elem(), &n)
	for _, c := range []struct {
		name    string
		in, out any
		skip    []string // fields the conversion adds
	}{
		{"fetchStats", st, fetchStats(st), nil},
		{"chunkCacheStats", cs, chunkCacheStats(cs), nil},
		{"apiReport", rep, apiReport(rep, "p"), []string{"Project"}},
	} {
		got, want := leaves(reflect.ValueOf(c.out), c.skip...), leaves(reflect.ValueOf(c.in))
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: the API's fields hold %v, want %v (the internal type's, in order)", c.name, got, want)
		}
	}
	for _, c := range []struct {
		name        string
		lazyd, wire any
	}{
		{"Stats", st, fetchStats(st)},
		{"CacheStats", cs, chunkCacheStats(cs)},
	} {
		a, _ := json.Marshal(c.lazyd)
		b, _ := json.Marshal(c.wire)
		if string(a) != string(b) {
			t.Errorf("lazy.%s's JSON differs from the API's:\nlazyd %s\nAPI   %s", c.name, a, b)
		}
	}
	if got := apiReport(report.Report{}, "p"); got.Setup == nil || got.Project != "p" {
		t.Errorf("apiReport of an empty report = %+v, want Setup [] and Project p", got)
	}
}
