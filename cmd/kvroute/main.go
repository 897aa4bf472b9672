// Command kvroute is the KV-cache-aware router: `kvroute serve` runs the Envoy ext_proc
// server, `kvroute proxy` a plain OpenAI-compatible reverse proxy, `kvroute version`
// prints the version.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kvroute/kvroute/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(app.Main(ctx, os.Args[1:], os.Stdout, os.Stderr))
}
