package app

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// flagLine matches a flag in pflag's usage listing ("      --log-level string   ...").
var flagLine = regexp.MustCompile(`(?m)^\s+(?:-[a-z], )?--([a-z0-9][a-z0-9._-]*)`)

// helpFlags returns the flags `kvroute ARGS --help` lists, from the flag definitions
// themselves (pflag prints every defined flag).
func helpFlags(t *testing.T, args ...string) []string {
	t.Helper()
	code, out, stderr := runMain(append(args, "--help")...)
	if code != 0 {
		t.Fatalf("kvroute %v --help: exit %d: %s", args, code, stderr)
	}
	var flags []string
	for _, m := range flagLine.FindAllStringSubmatch(out+stderr, -1) {
		flags = append(flags, m[1])
	}
	if len(flags) == 0 {
		t.Fatalf("kvroute %v --help lists no flags:\n%s%s", args, out, stderr)
	}
	return flags
}

// Every command-line flag of `kvroute serve|proxy|config|classify ...` is documented:
// a configuration key in docs/configuration.md (its table, checked by config's
// reference tests), --config and --log-level there too, and the classify flags in
// docs/classification.md, each named in backquotes.
func TestDocsMentionEveryFlag(t *testing.T) {
	read := func(p string) string {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(raw)
	}
	conf, cls := read("../docs/configuration.md"), read("../docs/classification.md")
	for _, cmd := range [][]string{{"serve"}, {"proxy"}, {"config"}} {
		flags := helpFlags(t, cmd...)
		for _, f := range []string{"config", "log-level"} {
			if !strings.Contains(strings.Join(flags, " "), f) {
				t.Errorf("kvroute %s has no --%s", cmd[0], f)
			}
		}
		for _, f := range flags {
			if !strings.Contains(conf, "`--"+f) && !strings.Contains(conf, "`"+f+"`") {
				t.Errorf("docs/configuration.md does not name kvroute %s's flag --%s", cmd[0], f)
			}
		}
	}
	for _, sub := range []string{"train", "eval", "pii"} {
		for _, f := range helpFlags(t, "classify", sub) {
			if !strings.Contains(cls, "`--"+f) {
				t.Errorf("docs/classification.md does not name kvroute classify %s's flag --%s", sub, f)
			}
		}
	}
}
