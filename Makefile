# kernelgate: `make run` serves on 127.0.0.1:8888, `make test` runs every test.
SHELL := /bin/sh
GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
GOFMT := $(dir $(GO))gofmt
BIN := bin/kernelgate
KERNELS := $(CURDIR)/.kernels
export CGO_ENABLED := 0

.PHONY: all build kernels run test test-exec test-deps k8s-binaries fuzz bench vet cross clean

all: build

build:
	$(GO) build -trimpath -o $(BIN) .

# The Python and Deno kernels and their kernelspecs in .kernels/ (idempotent).
kernels:
	@scripts/install-kernels.sh

run: kernels build
	./$(BIN) serve --kernelspec-dir $(KERNELS)

# What the tests need beyond the kernels (idempotent).
test-deps: kernels
	@scripts/install-test-deps.sh

# kube-apiserver and etcd for the tests on a real control plane (internal/k8stest),
# built once per machine into a cache outside the checkout keyed by
# internal/k8stest/controlplane/go.sum: about 4-6 minutes of both cores cold,
# instant afterwards.
k8s-binaries:
	@GO=$(GO) scripts/k8s-binaries.sh >/dev/null

# The Go files the go tool builds: folders named .* or _* and testdata are not its.
GOFILES = $$(find . -name '*.go' -not -path '*/.*' -not -path '*/_*' -not -path '*/testdata/*')

vet:
	@test -z "$$($(GOFMT) -l $(GOFILES))" || { echo "gofmt needed:"; $(GOFMT) -l $(GOFILES); exit 1; }
	$(GO) vet ./...

# kernelgate builds for macOS and Windows too (docs/benchmarks.md, "Portability"):
# vet compiles every package and its tests for both, then the binary is built.
# Test files that need Linux carry a linux build tag; the tests run on Linux.
cross:
	GOOS=darwin GOARCH=arm64 $(GO) vet ./...
	GOOS=windows GOARCH=amd64 $(GO) vet ./...
	GOOS=darwin GOARCH=arm64 $(GO) build -o /dev/null .
	GOOS=windows GOARCH=amd64 $(GO) build -o /dev/null .

# KERNELGATE_REQUIRE_ALL: a test whose prerequisites are missing fails
# instead of skipping, since this target installs or builds them all.
test: test-deps vet cross k8s-binaries
	KERNELGATE_REQUIRE_ALL=1 $(GO) test -count=1 -timeout 25m ./...
	$(MAKE) fuzz

# The whole suite again with every Python kernel exec'd (make test forks
# them from a zygote: docs/launcher.md); CI runs both.
test-exec: test-deps k8s-binaries
	KERNELGATE_REQUIRE_ALL=1 KERNELGATE_ZYGOTE=0 $(GO) test -count=1 -timeout 25m ./...

# Short, bounded fuzzing of the parsers that take untrusted input. The
# budgets are counts of inputs (about 5-10 s each here), not durations: a
# duration can end in Go's fuzzing coordinator reporting "context deadline
# exceeded" with no failing input (golang/go#75804, fixed in Go 1.27).
fuzz:
	$(GO) test ./jupyter -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime 300000x
	$(GO) test ./jupyter -run '^$$' -fuzz '^FuzzScanStrings$$' -fuzztime 100000x
	$(GO) test ./jupyter -run '^$$' -fuzz '^FuzzParseReady$$' -fuzztime 100000x
	$(GO) test ./internal/jsonscan -run '^$$' -fuzz '^FuzzValid$$' -fuzztime 300000x
	$(GO) test ./internal/jsonscan -run '^$$' -fuzz '^FuzzAppendString$$' -fuzztime 100000x
	$(GO) test ./internal/jsonscan -run '^$$' -fuzz '^FuzzMembers$$' -fuzztime 150000x
	$(GO) test ./internal/jsonscan -run '^$$' -fuzz '^FuzzEach$$' -fuzztime 100000x
	$(GO) test ./internal/jsonscan -run '^$$' -fuzz '^FuzzString$$' -fuzztime 100000x
	$(GO) test ./sessions -run '^$$' -fuzz '^FuzzFastReaders$$' -fuzztime 60000x
	$(GO) test ./gateway -run '^$$' -fuzz '^FuzzDecodeLegacyText$$' -fuzztime 40000x
	$(GO) test ./kernelspecs -run '^$$' -fuzz '^FuzzResourcePath$$' -fuzztime 130000x
	$(GO) test ./mcp -run '^$$' -fuzz '^FuzzAnswerBound$$' -fuzztime 50000x

# Benchmarks (docs/benchmarks.md): the kernel client against internal/directclient (Go
# benchmarks, about 1 minute), the state store's durable writes and run-record throughput
# (about 15 seconds), then bench/, kernelgate side by side with the direct client and
# Debian's Jupyter Server (about 6 minutes), with kernel pods of kubernetes-provisioner on the
# test control plane against local kernels, which writes its table into docs/benchmarks.md.
# One section alone: make build && go run ./bench -only state (the state store on and off,
# and the start with 100 kernels to re-adopt; about 3 minutes), or -only replicas (three
# replicas on a private PostgreSQL: forwarding, load spread over them, failover; about 2 minutes).
bench: kernels build k8s-binaries
	@bench/install-jupyter-server.sh
	$(GO) test ./jupyter -run '^$$' -bench . -benchtime 1x -timeout 20m
	$(GO) test ./state -run '^$$' -bench . -benchtime 2s
	$(GO) run ./bench -write docs/benchmarks.md

clean:
	rm -rf bin
