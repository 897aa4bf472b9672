package admission

import (
	"strings"
	"testing"
)

// FuzzParseKeys: any key file is either refused with an error that shows no line
// content, or parsed into valid tenants; nothing panics.
func FuzzParseKeys(f *testing.F) {
	f.Add(hashHex("sk-a") + " alpha\n# c\n\n" + hashHex("sk-b") + " beta\n")
	f.Add(hashHex("k") + " a\n" + hashHex("k") + " b\n")
	f.Add("zz t\n")
	f.Add(strings.Repeat("a", 70000))
	f.Fuzz(func(t *testing.T, text string) {
		keys, err := parseKeys(strings.NewReader(text), "keys")
		if err != nil {
			return
		}
		for _, tenant := range keys {
			if !validTenant(tenant) {
				t.Fatalf("invalid tenant %q accepted", tenant)
			}
		}
	})
}
