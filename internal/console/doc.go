// Package console serves Corral's web console: a single-page application of static files,
// bundled from web/ at build time (go generate, or make console) into dist/ and embedded in the
// binary, so a Corral needs neither npm nor the network to serve it.
//
// The files carry no data and need no token: everything the console shows or does is an API
// call the browser makes with the user's own token (an Authorization header, kept in
// sessionStorage), so the console can do nothing that token cannot. Because sandbox names,
// labels and command output are written by whoever holds a sandbox, the pages put API strings
// into the page only as text (textContent, never innerHTML: TestNoHTMLSinks checks the
// sources), and every response carries a Content-Security-Policy that allows scripts only
// from the console's own origin and forbids framing.
package console

//go:generate go run ./bundle/cmd/consolebundle
