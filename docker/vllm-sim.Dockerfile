# vllm-sim image: a simulated vLLM worker (OpenAI API with SSE, /metrics, /tokenize,
# ZMQ KV events). Multi-stage, cgo (libzmq publisher), non-root.
# Build from the repository root:
#   docker build -f docker/vllm-sim.Dockerfile -t vllm-sim .
# The go build line is the Makefile's GOBUILD with -o; examples/docker-compose's test
# checks that they agree.
FROM golang:1.26-bookworm AS build
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends libzmq3-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=1 go build -trimpath -ldflags "-s -w -X github.com/kvroute/kvroute/app.Version=${VERSION}" -o /out/vllm-sim ./cmd/vllm-sim

FROM debian:bookworm-slim
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends libzmq5 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/vllm-sim /usr/local/bin/vllm-sim
USER 65532:65532
# OpenAI HTTP API + /metrics, ZMQ KV event publisher, ZMQ replay
EXPOSE 8000 5557 5567
ENTRYPOINT ["/usr/local/bin/vllm-sim"]
# --host 0.0.0.0: the simulator listens on 127.0.0.1 by default.
CMD ["--host", "0.0.0.0", "--port", "8000", "--kv-port", "5557", "--kv-replay-port", "5567"]
