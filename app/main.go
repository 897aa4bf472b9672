package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/kvroute/kvroute/classify"
	"github.com/kvroute/kvroute/config"
)

// environ is os.Environ, replaceable in tests.
var environ = os.Environ

// Version is set at build time with -ldflags "-X github.com/kvroute/kvroute/app.Version=…".
var Version = "dev"

const usage = `kvroute — KV-cache-aware router for vLLM behind Envoy

Usage:
  kvroute serve [flags]    run the Envoy ext_proc server (gRPC), gRPC health and admin HTTP
  kvroute proxy [flags]    run a plain OpenAI-compatible reverse proxy (no Envoy) and admin HTTP
  kvroute config [flags]   print the effective configuration (defaults applied), then exit
  kvroute classify CMD     train, evaluate a text classifier or score PII recognizers (docs/classification.md)
  kvroute version          print the version

Every configuration key is a flag (--router.ticket_ttl=5m) and an environment variable
(KVROUTE_ROUTER_TICKET_TTL=5m); --config FILE (or KVROUTE_CONFIG) names the YAML file.
Run "kvroute serve --help" for every key.
`

// Main runs the kvroute command line with args (without the program name) and returns
// the process exit code: 0 success, 1 runtime failure, 2 usage or configuration error.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "version", "--version", "-v":
		fmt.Fprintln(stdout, "kvroute", Version)
		return 0
	case "help", "--help", "-h":
		fmt.Fprint(stdout, usage)
		return 0
	case "classify":
		return classify.Command(rest, stdout, stderr)
	case "serve", "proxy", "config":
	default:
		fmt.Fprintf(stderr, "kvroute: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	fs := config.Flags("kvroute " + cmd)
	fs.SetOutput(stderr)
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(rest); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "kvroute %s: %v\nRun \"kvroute %s --help\" for every flag.\n", cmd, err, cmd)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvroute %s: unexpected argument %q (configuration is given with --key=value flags)\n", cmd, fs.Arg(0))
		return 2
	}
	if err := config.CheckEnviron(environ()); err != nil {
		fmt.Fprintln(stderr, "kvroute:", err)
		return 2
	}
	cfg, err := config.Load(fs, nil)
	if err != nil {
		fmt.Fprintln(stderr, "kvroute:", err)
		return 2
	}
	if cmd == "config" {
		// What the server will use: defaults applied where a zero selects one.
		eff := cfg.Effective()
		for _, kv := range config.Values(&eff) {
			fmt.Fprintf(stdout, "%s = %s\n", kv.Key, kv.Value)
		}
		return 0
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(strings.ToUpper(*logLevel))); err != nil {
		fmt.Fprintf(stderr, "kvroute: --log-level: %v\n", err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	a, err := New(cfg, logger)
	if err != nil {
		fmt.Fprintln(stderr, "kvroute:", err)
		return 2
	}
	ls, err := Listen(cfg, cmd == "proxy")
	if err != nil {
		fmt.Fprintln(stderr, "kvroute:", err)
		return 1
	}
	if err := a.Run(ctx, ls); err != nil {
		fmt.Fprintln(stderr, "kvroute:", err)
		return 1
	}
	return 0
}
