package app

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func runMain(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = Main(context.Background(), args, &o, &e)
	return code, o.String(), e.String()
}

// A usage error exits 2 and says what was wrong: silence would leave the operator guessing.
func TestMainUsageErrorsAreReported(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"config", "--router.tiket_ttl=5s"}, "unknown flag: --router.tiket_ttl"},
		{[]string{"serve", "--config"}, "flag needs an argument"},
		{[]string{"serve", "extra-arg"}, `unexpected argument "extra-arg"`},
		{[]string{"launch"}, `unknown command "launch"`},
		{[]string{"config", "--router.ticket_ttl=5x"}, "router.ticket_ttl"},
	}
	for _, tc := range cases {
		code, _, stderr := runMain(tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("kvroute %v: exit %d, stderr %q; want exit 2 and %q", tc.args, code, stderr, tc.want)
		}
	}
}

// `kvroute config` prints every effective key as key = value, lists in the config's own
// key names, with the defaults the server applies where a zero selects one
// (config.Effective), not the zeros.
func TestMainConfigPrintsKeys(t *testing.T) {
	code, out, stderr := runMain("config", "--router.ticket_ttl=5m", `--workers=[{address: "127.0.0.1:8001"}]`,
		`--models=[{name: m1}]`, `--admission.classes=[{name: chat}]`)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"router.ticket_ttl = 5m0s\n", "server.ext_proc_addr = :9002\n", `"address":"127.0.0.1:8001"`,
		`"kv_dtype_bytes":2,`, `"block_size":16,`, `"remote_tokenize_timeout":"250ms"`, `"name":"127.0.0.1:8001"`,
		`"max_num_seqs":256,`, `"slo_attainment":0.9`, `"on_slo_miss":"admit"`,
		"tokenize.cache_bytes = 67108864\n", "tokenize.shadow.fraction = 0.01\n", "index.replay_buffer_frames = 4096\n",
		"scoring.scrape.timeout = 1s\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
