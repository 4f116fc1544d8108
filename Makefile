# The operation ledger. `make run` serves it (embedded engine unless
# LEDGER_REDIS_URL is set); `make test` runs the whole test suite against a
# real redis-server it starts itself (installing Debian's redis-server when
# missing and running as root).

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-builtin-rules

# Pinned tool versions, installed into ./bin by `make tools`.
BUF_VERSION                := v1.75.0
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
GRPC_GATEWAY_VERSION := v2.33.0
STATICCHECK_VERSION        := v0.8.2
GRPCURL_VERSION            := v1.9.4

BIN       := $(CURDIR)/bin
GO        ?= go
# Node.js where scripts/ensure-node.sh put one, when the machine has none of
# version 20 or later.
export PATH := $(BIN)/node/bin:$(PATH)
FUZZTIME  ?= 30s
# How long the fuzzer may spend shrinking a new input (Go's default, 60s, can
# take most of a short run).
FUZZMINIMIZETIME ?= 5s
ARGS      ?=
# Flags of `make bench` (cmd/ledgerbench): the default adds the growth
# measurement with 1k and 1M records stored (several minutes). The peer part
# builds internal/bench/peer; --peer-src DIR builds the peer from a source
# tree of it when the Go module proxy does not serve it.
BENCH_ARGS ?= --growth 1000,1000000
# What `buf breaking` compares the protos with: the main branch (a buf git
# input; BREAKING_AGAINST=... for another).
BREAKING_AGAINST ?= .git\#branch=main,subdir=proto
# The commit that published ledger.v1: every later proto must stay
# compatible with it (checked besides BREAKING_AGAINST, which on main itself
# compares main with main).
PROTO_V1_BASELINE := 81f0528db3e89469d27041f72b0e5c9a3b244dcf
# The Node example's packages, installed with `npm ci` from its package-lock.json.
NODE_EXAMPLE_DEPS := examples/node/node_modules/.installed
# The MCP example's Node client's packages (the official MCP SDK), likewise.
MCP_NODE_DEPS := examples/mcp/node/node_modules/.installed
# The TypeScript package's packages (its build and test tools and the agent
# frameworks its adapters are tested with), likewise.
TS_CLIENT_DEPS := clients/typescript/node_modules/.installed
# Every fuzz target, as package:Target.
FUZZ_TARGETS := fingerprint:FuzzCanonicalJSON fingerprint:FuzzComputeFingerprint \
  internal/jsonvalue:FuzzParams ledger:FuzzKeyEncoding ledger:FuzzValidateID \
  ledger:FuzzCompactScript ledger:FuzzParsePolicies ledger:FuzzPolicyValue ledger:FuzzGlobMatch \
  ledger:FuzzDecodePageToken ledger:FuzzRunPageToken ledger:FuzzNewRecordTail \
  server:FuzzStructParams server:FuzzWriteJSONStruct server:FuzzHandlers httpapi:FuzzHandler \
  server:FuzzUnmarshalReserve server:FuzzDecodeStruct server:FuzzUnmarshalComplete \
  server:FuzzParseCredentials server:FuzzAuthenticate internal/bench:FuzzParseCPUList \
  cmd/ledgerd:FuzzRedisURLRedaction cmd/ledgerctl:FuzzParseData cmd/ledgerctl:FuzzFencingToken \
  mcpgateway:FuzzParseConfig mcpgateway:FuzzReadMeta mcpgateway:FuzzArguments mcpgateway:FuzzFitted mcpgateway:FuzzRecord \
  mcpgateway:FuzzJSRegexp mcpgateway:FuzzMessageLines mcpgateway:FuzzCutURLs \
  receipt:FuzzVerify receipt:FuzzResultSHA256 receipt:FuzzParseJWK cmd/ledgerctl:FuzzVerifyHistory
# The configuration `make mcp` runs the gateway with.
MCP_CONFIG ?= examples/mcp/gateway.yaml

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{ printf "  %-16s %s\n", $$1, $$2 }'

.PHONY: run
run: ## run ledgerd on 127.0.0.1:50051 (embedded engine unless LEDGER_REDIS_URL is set; ARGS=... for flags)
	$(GO) run ./cmd/ledgerd $(ARGS)

.PHONY: mcp
mcp: ## run the MCP gateway (ledgermcp) with MCP_CONFIG (the demo ticket desk of examples/mcp) on the ledger of make run (ARGS=... for flags)
	$(GO) run ./cmd/ledgermcp --config $(MCP_CONFIG) $(ARGS)

.PHONY: build
build: ## build bin/ledgerd and bin/ledgermcp
	$(GO) build -o $(BIN)/ledgerd ./cmd/ledgerd
	$(GO) build -o $(BIN)/ledgermcp ./cmd/ledgermcp

.PHONY: test
test: check-generate lint-proto $(BIN)/.grpcurl-$(GRPCURL_VERSION) $(NODE_EXAMPLE_DEPS) $(MCP_NODE_DEPS) $(TS_CLIENT_DEPS) ## the whole test suite, with -race, on real redis-server processes; also: gen/ up to date, buf lint and breaking, the README walkthrough, the Python package (pytest), the TypeScript package (tsc, node --test, with the Vercel AI SDK, the OpenAI Agents SDK and LangGraph; its npm pack tarball installed into a fresh project), the Python and Node examples, the MCP gateway with a Node MCP client, the console in headless Chromium
	./scripts/ensure-redis-server.sh
	./scripts/ensure-python-grpc.sh
	./scripts/ensure-jq.sh
	./scripts/ensure-curl.sh
	./scripts/ensure-chromium.sh
	./scripts/ensure-valgrind.sh
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go') | grep -v '^gen/' || true); \
	  if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	LEDGER_TEST_POLYGLOT=require LEDGER_TEST_GRPCURL=$(BIN)/grpcurl $(GO) test -race -count=1 -timeout 20m ./...
	cd alertrules && $(GO) vet ./... && $(GO) test -race -count=1 ./...

.PHONY: check
check: $(BIN)/.staticcheck-$(STATICCHECK_VERSION) ## the inner loop: gofmt, go vet, staticcheck, and the short tests of ledger, server and client (about two minutes)
	./scripts/ensure-redis-server.sh
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/'))" || { gofmt -l $$(git ls-files '*.go' | grep -v '^gen/'); exit 1; }
	$(GO) vet ./...
	$(BIN)/staticcheck ./...
	$(GO) test -short -count=1 ./ledger/ ./server/ ./client/

.PHONY: test-faults
test-faults: ## the fault suite alone in its long form (more kills, longer schedules; also part of make test in its short form; docs/failure-model.md)
	./scripts/ensure-redis-server.sh
	LEDGER_TEST_FAULTS=long $(GO) test -race -count=1 -timeout 40m -v ./internal/faults/ 2>&1 | grep -E '^(=== RUN|--- |ok|FAIL|PASS)|MEASURED|lost|linearizab|duplicate'

.PHONY: bench
bench: ## measure ledgerd on fresh redis-servers: throughput and latency against health Check, memory per record, growth, the MCP gateway's cost per call (BENCH_ARGS=... for flags; docs/benchmarks.md)
	./scripts/ensure-redis-server.sh
	-./scripts/ensure-valgrind.sh # without it the instructions part says what to install
	$(GO) build -o $(BIN)/ledgerd ./cmd/ledgerd
	$(GO) build -o $(BIN)/ledgermcp ./cmd/ledgermcp
	$(GO) run ./cmd/ledgerbench --ledgerd $(BIN)/ledgerd --ledgermcp $(BIN)/ledgermcp --go $(GO) $(BENCH_ARGS)

.PHONY: screenshots
screenshots: ## retake docs/img's console screenshots in headless Chromium (the console's browser test)
	./scripts/ensure-redis-server.sh
	./scripts/ensure-chromium.sh
	LEDGER_CONSOLE_SCREENSHOTS=$(CURDIR)/docs/img LEDGER_TEST_POLYGLOT=require $(GO) test -count=1 -run TestConsoleInABrowser ./console

.PHONY: fuzz
fuzz: ## run every fuzz target (FUZZ_TARGETS) for FUZZTIME each (default 30s)
	./scripts/ensure-redis-server.sh # the ledger's targets run their scripts on it
	@for t in $(FUZZ_TARGETS); do \
	  echo "fuzz $$t"; \
	  $(GO) test -run '^$$' -fuzz "^$${t#*:}\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZETIME) "./$${t%%:*}/"; \
	done

.PHONY: tools
tools: $(BIN)/.buf-$(BUF_VERSION) $(BIN)/.protoc-gen-go-$(PROTOC_GEN_GO_VERSION) $(BIN)/.protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION) $(BIN)/.grpc-gateway-$(GRPC_GATEWAY_VERSION) ## install the pinned code generators into ./bin

$(BIN)/.buf-$(BUF_VERSION):
	GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	@touch $@
$(BIN)/.protoc-gen-go-$(PROTOC_GEN_GO_VERSION):
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	@touch $@
$(BIN)/.protoc-gen-go-grpc-$(PROTOC_GEN_GO_GRPC_VERSION):
	GOBIN=$(BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	@touch $@
$(BIN)/.grpc-gateway-$(GRPC_GATEWAY_VERSION):
	GOBIN=$(BIN) $(GO) install github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway@$(GRPC_GATEWAY_VERSION) \
	  github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2@$(GRPC_GATEWAY_VERSION)
	@touch $@
$(BIN)/.staticcheck-$(STATICCHECK_VERSION):
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	@touch $@
$(BIN)/.grpcurl-$(GRPCURL_VERSION):
	GOBIN=$(BIN) $(GO) install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)
	@touch $@

.PHONY: generate
generate: tools ## regenerate gen/ (Go and Python) from proto/ with the pinned local plugins and Debian's protoc
	./scripts/generate.sh

.PHONY: check-generate
check-generate: tools ## fail when gen/ differs from what `make generate` produces (generated into a temporary directory)
	./scripts/generate.sh --check

.PHONY: lint
lint: lint-proto $(BIN)/.staticcheck-$(STATICCHECK_VERSION) ## buf lint, format and breaking, gofmt, go vet, staticcheck
	@test -z "$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/'))" || { gofmt -l $$(git ls-files '*.go' | grep -v '^gen/'); exit 1; }
	$(GO) vet ./...
	$(BIN)/staticcheck ./...
	cd alertrules && $(GO) vet ./... && $(BIN)/staticcheck ./...

.PHONY: lint-proto
lint-proto: tools ## buf lint, buf format and buf breaking against ledger.v1 as published and against the main branch (BREAKING_AGAINST)
	$(BIN)/buf lint
	$(BIN)/buf format -d --exit-code
	@if git cat-file -e '$(PROTO_V1_BASELINE)^{commit}' 2>/dev/null; then \
	  echo "buf breaking proto --against '.git#ref=$(PROTO_V1_BASELINE),subdir=proto'"; $(BIN)/buf breaking proto --against '.git#ref=$(PROTO_V1_BASELINE),subdir=proto'; \
	else echo "buf breaking against ledger.v1 as published skipped: commit $(PROTO_V1_BASELINE) is not in this clone (a shallow one?)"; fi
	@if [ "$(BREAKING_AGAINST)" != '.git#branch=main,subdir=proto' ] || git rev-parse -q --verify refs/heads/main >/dev/null; then \
	  echo "buf breaking proto --against '$(BREAKING_AGAINST)'"; $(BIN)/buf breaking proto --against '$(BREAKING_AGAINST)'; \
	elif git rev-parse -q --verify refs/remotes/origin/main >/dev/null; then \
	  echo "buf breaking proto --against '.git#ref=origin/main,subdir=proto'"; $(BIN)/buf breaking proto --against '.git#ref=origin/main,subdir=proto'; \
	else echo "buf breaking skipped: no main branch here to compare with (BREAKING_AGAINST=... to choose one)"; fi

$(NODE_EXAMPLE_DEPS): examples/node/package.json examples/node/package-lock.json
	./scripts/ensure-node.sh
	cd examples/node && npm ci --no-audit --no-fund --loglevel=error
	node scripts/check-npm-optional.mjs examples/node
	@touch $@

$(MCP_NODE_DEPS): examples/mcp/node/package.json examples/mcp/node/package-lock.json
	./scripts/ensure-node.sh
	cd examples/mcp/node && npm ci --no-audit --no-fund --loglevel=error
	node scripts/check-npm-optional.mjs examples/mcp/node
	@touch $@

$(TS_CLIENT_DEPS): clients/typescript/package.json clients/typescript/package-lock.json
	./scripts/ensure-node.sh
	cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error
	node scripts/check-npm-optional.mjs clients/typescript
	@touch $@

.PHONY: grpcurl
grpcurl: $(BIN)/.grpcurl-$(GRPCURL_VERSION) ## install the pinned grpcurl into ./bin

.PHONY: ci
ci: test ## what CI runs (.ci/run): the test suite

.PHONY: clean
clean: ## remove ./bin
	rm -rf $(BIN)
