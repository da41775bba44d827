// Package model is the server's own types for what Corral's API speaks of: sandboxes, layers,
// environments, projects, tokens, quotas, exec streams, trajectories, volumes, nodes. The API
// server decodes requests into them and encodes answers from them; the edge, the catalogue, the
// store and the node protocol work in them. None of those packages imports the SDK
// (sdk/go, a module of its own that clients use), so the SDK can change its Go API (helpers,
// methods, its own types for what clients build) without touching a server package.
//
// What the two share is the wire: TestWireShape type-checks this package and the SDK from source
// and holds every type here to the SDK's type of the same name (the same fields in the same order,
// the same JSON tags, field types of the same shape) and every constant to the SDK's value, so a
// field added on one side only fails the build's tests, naming the field. The store keeps these
// types as JSON documents too (a sandbox's request, a layer's image config), byte for byte as the
// SDK's types wrote them before this package existed.
//
// cmd/corral's TestSDKImporters keeps the boundary: only the client packages (the CLI, the E2B
// gateway, the environment installer, the benchmarks) import the SDK.
package model
