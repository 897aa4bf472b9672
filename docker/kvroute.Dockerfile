# kvroute image: multi-stage, cgo (libzmq for the KV event subscriber), non-root.
# Build from the repository root:
#   docker build -f docker/kvroute.Dockerfile --build-arg VERSION=$(git describe --always) -t kvroute .
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
RUN CGO_ENABLED=1 go build -trimpath -ldflags "-s -w -X github.com/kvroute/kvroute/app.Version=${VERSION}" -o /out/kvroute ./cmd/kvroute

FROM debian:bookworm-slim
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends libzmq5 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/kvroute /usr/local/bin/kvroute
# 65532 = "nonroot" in distroless conventions; no shell login, no home needed.
USER 65532:65532
# ext_proc gRPC, gRPC health, admin HTTP (/metrics, /healthz, /readyz)
EXPOSE 9002 9003 9090
ENTRYPOINT ["/usr/local/bin/kvroute"]
CMD ["serve", "--config", "/etc/kvroute/kvroute.yaml"]
