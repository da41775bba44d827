// Package build builds Corral environments from Dockerfiles (`corral env build`, POST
// /v1/builds): a hand-written Dockerfile parser (Parse: continuations, comments, exec and shell
// forms, ARG before FROM), variable expansion (Expand), .dockerignore (ParseIgnore), build
// contexts uploaded as tars and checked like every archive Corral takes (ReadContext), the
// planner that turns a Dockerfile into steps with cache inputs (MakePlan), and the jobs that run
// the steps on a Backend (the edge) and keep their logs (Jobs).
//
// Each RUN or COPY step runs in a sandbox of its own made on the layers below it; its writable
// layer becomes a layer named LayerName whose version is the step's cache key, sha256 of the
// parent's key and the step's inputs, and which stacks (Layer.Below) on every layer under it.
// A rebuild finds the layers of unchanged steps by key and runs only the steps after the first
// change. The environment's base is one more layer of the top step's content and stack that
// carries the configuration (ENV, WORKDIR, USER, CMD, ENTRYPOINT, LABEL).
//
// Concurrency: Jobs.mu protects the job table; each Job.mu its state and events (lock order:
// Jobs.mu, then Job.mu). One goroutine per running build, started by Jobs.Start and ended by
// the build's end or the context given to NewJobs; followers wait on Job's changed channel.
package build
