package placement

import (
	"maps"
	"slices"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lazyregexp"
)

// Label limits: node labels, node selectors and project placements are small by design.
const (
	MaxLabels    = 32 // labels per node or selector
	MaxSelectors = 16 // selectors per Pin or Avoid list
)

var (
	labelKeyRE   = lazyregexp.New(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,62}[A-Za-z0-9])?$`)
	labelValueRE = lazyregexp.New(`^[A-Za-z0-9._-]{0,63}$`)
)

// ValidateLabels checks node labels or a selector: at most MaxLabels, keys of 1-64 letters,
// digits and . _ / - (starting and ending with a letter or digit), values of at most 63
// letters, digits and . _ -.
func ValidateLabels(field string, labels map[string]string) error {
	if len(labels) > MaxLabels {
		return errdefs.Invalid(field, "%d labels: at most %d", len(labels), MaxLabels)
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if !labelKeyRE.MatchString(k) {
			return errdefs.Invalid(field, "label key %q: 1-64 letters, digits, '.', '_', '/' or '-', starting and ending with a letter or digit", k)
		}
		if !labelValueRE.MatchString(labels[k]) {
			return errdefs.Invalid(field, "label %s=%q: the value has at most 63 letters, digits, '.', '_' or '-'", k, labels[k])
		}
	}
	return nil
}

// ValidateSelectors checks a Pin or Avoid list.
func ValidateSelectors(field string, list []map[string]string) error {
	if len(list) > MaxSelectors {
		return errdefs.Invalid(field, "%d selectors: at most %d", len(list), MaxSelectors)
	}
	for _, s := range list {
		if len(s) == 0 {
			return errdefs.Invalid(field, "an empty selector matches every node; leave it out")
		}
		if err := ValidateLabels(field, s); err != nil {
			return err
		}
	}
	return nil
}

// Matches reports whether labels carry every label of selector s.
func Matches(s, labels map[string]string) bool {
	for k, v := range s {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
