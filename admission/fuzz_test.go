package admission

import (
	"slices"
	"strings"
	"testing"
	"time"
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

// FuzzDecodeReserve: any reply to the reserve script — another length, unknown codes,
// out-of-range counter indexes, negative counts — is decoded without a panic into an
// admission, a refusal naming a known reason with non-negative remainders and a
// positive reset, or an error; never an admission from a reply whose code is not 0.
func FuzzDecodeReserve(f *testing.F) {
	f.Add(int64(0), int64(0), int64(0), int64(1), int64(10), uint8(5))
	f.Add(int64(3), int64(2), int64(500), int64(1), int64(10), uint8(5))
	f.Add(int64(3), int64(9), int64(5), int64(1), int64(10), uint8(5))
	f.Add(int64(3), int64(-1), int64(5), int64(1), int64(10), uint8(5))
	f.Add(int64(7), int64(0), int64(0), int64(0), int64(0), uint8(5))
	f.Add(int64(1), int64(0), int64(0), int64(-3), int64(0), uint8(4))
	f.Fuzz(func(t *testing.T, code, idx, used, reqs, minute int64, n uint8) {
		v := []int64{code, idx, used, reqs, minute, 0}[:min(int(n), 6)]
		p := plan{tenant: "t", rpm: 60, conc: 5, cost: 100,
			tokens: []tokenLimit{{window: time.Minute, limit: 1000}, {model: "m", window: time.Hour, limit: 5000}}}
		admitted, ref, err := decodeReserve(v, p, fixed())
		switch {
		case err != nil:
			if admitted || ref != nil {
				t.Fatalf("%v: error %v with a decision", v, err)
			}
		case admitted:
			if len(v) != 5 || code != 0 || ref != nil {
				t.Fatalf("%v: admitted", v)
			}
		default:
			if ref == nil || !slices.Contains([]string{"concurrency", "requests", "tokens"}, ref.Reason) ||
				ref.TokensRemaining < 0 || ref.RequestsRemaining < 0 || ref.Reset <= 0 {
				t.Fatalf("%v: refusal %+v", v, ref)
			}
		}
	})
}
