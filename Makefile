# Corral: sandboxes for AI agents. `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/corral-dev/corral/internal/daemon.Version=$(VERSION) -X github.com/corral-dev/corral/internal/cli.leanVersion=$(VERSION)
DATA_DIR ?= /var/lib/corral
# Two Go modules: the server (this directory) and the Go SDK (sdk/go, which `./...` here does not
# reach); test and lint run both.
# Tests: race detector on, two packages at a time (CI has two cores).
TEST_FLAGS ?= -race -p 2 -timeout 75m

.PHONY: help setup build run test redteam soak bench lint fuzz clean console

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'

setup: ## install what the host lacks (Debian packages, a current runc; as root)
	@scripts/setup.sh

build: ## build bin/corral (the lean CLI), bin/corrald (the same with the daemon), the static bin/corral-agent, bin/corral-runcd and bin/corral-bench
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/corral-agent ./cmd/corral-agent
	CGO_ENABLED=1 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/corral-runcd ./cmd/corral-runcd
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/corrald ./cmd/corral
	$(GO) build -trimpath -tags lean -ldflags '$(LDFLAGS)' -o bin/corral ./cmd/corral
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/corral-bench ./cmd/corral-bench

run: setup build ## set up, build, start `corral up` on its defaults and show a sandbox at work
	@scripts/run.sh

test: setup build ## run every test of both modules (root-only tests run as root, skip elsewhere)
	cd sdk/go && $(GO) test $(TEST_FLAGS) ./...
	CORRAL_BIN=$(CURDIR)/bin $(GO) test $(TEST_FLAGS) ./...

redteam: build ## run the red-team suite (as root)
	CORRAL_BIN=$(CURDIR)/bin $(GO) test -race -count=1 -timeout 30m ./internal/e2e -run 'TestRedTeam'

# The soak's length (a Go duration).
SOAK ?= 1h

soak: build ## an hour of mixed load (SOAK=10m for less), reporting fds, goroutines, RSS, mounts, loops (as root)
	set -o pipefail; CORRAL_BIN=$(CURDIR)/bin CORRAL_SOAK=$(SOAK) $(GO) test -count=1 -timeout 0 -v ./internal/e2e -run '^TestSoak$$' 2>&1 | grep -E '^(=== RUN|--- |PASS|FAIL|ok)|SOAK|FAULT|soak_test|fault_'

bench: setup build ## run the benchmarks and print the figures for docs/BENCHMARKS.md
	@scripts/bench.sh

lint: ## gofmt, go vet
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	cd sdk/go && $(GO) vet ./...

fuzz: ## run each fuzz target for a short while
	@scripts/fuzz.sh

console: ## rebuild the web console's bundle (internal/console/dist) from its sources and pinned npm packages
	cd internal/console/web && npm ci --no-audit --no-fund
	$(GO) generate ./internal/console

clean: ## remove build outputs
	rm -rf bin
