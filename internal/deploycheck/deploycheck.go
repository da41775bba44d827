// Package deploycheck holds the tests of the deployment files under deploy/ (no code).
package deploycheck
