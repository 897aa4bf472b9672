package classify

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func spansOf(text string) []string {
	var out []string
	for _, s := range FindPII(nil, text) {
		out = append(out, s.Type+":"+text[s.Start:s.End])
	}
	return out
}

func TestFindPIIValidatesEachType(t *testing.T) {
	cases := []struct {
		text string
		want string // "type:span" joined by "|", empty for none
	}{
		{"mail jane.doe@example.com now", "email:jane.doe@example.com"},
		{"a..b@example.com", ""},
		{"user@localhost", ""},
		{"call (415) 555-2671 today", "phone:(415) 555-2671"},
		{"call 415-555-2671", "phone:415-555-2671"},
		{"call +44 20 7946 0958", "phone:+44 20 7946 0958"},
		{"order 4155552671", ""},
		{"on 2024-01-15", ""},
		{"exchange 415-155-2671", ""}, // exchange code starts with 1
		{"card 4111 1111 1111 1111 ok", "credit_card:4111 1111 1111 1111"},
		{"card 4111111111111112", ""}, // Luhn fails
		{"card 1234567812345670", ""}, // Luhn passes, no issuer prefix
		{"amex 378282246310005.", "credit_card:378282246310005"},
		{"IBAN DE89 3704 0044 0532 0130 00 AND MORE", "iban:DE89 3704 0044 0532 0130 00"},
		{"IBAN GB82WEST12345698765432", "iban:GB82WEST12345698765432"},
		{"IBAN DE88 3704 0044 0532 0130 00", ""}, // mod-97 fails
		{"ssn 123-45-6789", "us_ssn:123-45-6789"},
		{"ssn 666-45-6789 000-12-3456 912-34-5678 123-00-4567 123-45-0000", ""},
		{"ip 192.168.1.20:8080", "ipv4:192.168.1.20"},
		{"v 1.2.3.4.5 and 256.1.1.1 and 01.2.3.4", ""},
		{"key AKIAIOSFODNN7EXAMPLE", "aws_access_key:AKIAIOSFODNN7EXAMPLE"},
		{"key AKIAIOSFODNN7EXAMPLEX", ""},
		{"Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlLXNpZ25hdHVyZQ", "jwt:eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJlLXNpZ25hdHVyZQ"},
		{"eyJub3RoaW5nIjoxfQ.eyJzdWIiOiIxIn0.c2lnbmF0dXJlLXNpZ25hdHVyZQ", ""}, // header without alg
		{"-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----", ""},
		{"x -----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n-----END OPENSSH PRIVATE KEY----- y",
			"private_key:-----BEGIN OPENSSH PRIVATE KEY-----\nb3Bl\n-----END OPENSSH PRIVATE KEY-----"},
		{"uuid 123e4567-e89b-12d3-a456-426614174000 sha da39a3ee5e6b4b0d3255bfef95601890afd80709", ""},
		{"ip 10.0.0.1 and mail ops@corp.io", "ipv4:10.0.0.1|email:ops@corp.io"},
	}
	for _, c := range cases {
		if got := strings.Join(spansOf(c.text), "|"); got != c.want {
			t.Errorf("%q: got %q, want %q", c.text, got, c.want)
		}
	}
}

func TestFindPIIAppendsSortedWithoutOverlap(t *testing.T) {
	text := "4111 1111 1111 1111 then 415-555-2671 then a@b.co"
	pre := []Span{{Type: "x", Start: 99, End: 100}}
	got := FindPII(pre, text)
	if len(got) != 4 || got[0].Type != "x" {
		t.Fatalf("%v", got)
	}
	for i := 2; i < len(got); i++ {
		if got[i].Start < got[i-1].End {
			t.Fatalf("spans overlap or are unsorted: %v", got)
		}
	}
}

// testdata/pii.jsonl is written by scripts/gen-pii-testdata.py: 405 labelled spans of the
// nine types and 360 look-alike negatives (bad Luhn and mod-97, never-issued SSNs, order
// numbers, UUIDs, hashes, dates, version strings, public keys and certificates).
func TestCommandPII(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Command([]string{"pii", "--data", "testdata/pii.jsonl"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rep PIIReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Rows != 720 || len(rep.PerType) != len(PIITypes) {
		t.Fatalf("%+v", rep)
	}
	for typ, s := range rep.PerType {
		if s.Labelled == 0 || s.Precision < 0.98 || s.Recall < 0.95 {
			t.Errorf("%s: %+v, want precision ≥ 0.98, recall ≥ 0.95", typ, s)
		}
	}
	dir := t.TempDir()
	for name, body := range map[string]string{
		"type":  `{"text":"abc","spans":[{"type":"nope","start":0,"end":1}]}`,
		"range": `{"text":"abc","spans":[{"type":"email","start":2,"end":9}]}`,
		"json":  `{"text":`,
	} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body+"\n"), 0o644)
		errb.Reset()
		if code := Command([]string{"pii", "--data", p}, &out, &errb); code != 1 || !strings.Contains(errb.String(), ":1:") {
			t.Errorf("%s: exit %d, %q", name, code, errb.String())
		}
	}
	if code := Command([]string{"pii"}, &out, &errb); code != 2 {
		t.Errorf("no --data: exit %d", code)
	}
}

func TestEvaluatePIICountsMisses(t *testing.T) {
	rows := []PIIRow{
		{Text: "ssn 123-45-6789", Spans: []Span{{Type: PIIUSSSN, Start: 4, End: 15}}},
		{Text: "nothing here", Spans: []Span{{Type: PIIEmail, Start: 0, End: 7}}},
		{Text: "ip 10.1.2.3", Spans: nil},
	}
	rep := EvaluatePII(rows)
	if s := rep.PerType[PIIEmail]; s.Recall != 0 || s.Labelled != 1 {
		t.Errorf("email %+v", s)
	}
	if s := rep.PerType[PIIIPv4]; s.Precision != 0 || s.Found != 1 {
		t.Errorf("ipv4 %+v", s)
	}
	if o := rep.Overall; o.Precision != 0.5 || o.Recall != 0.5 {
		t.Errorf("overall %+v", o)
	}
}

func BenchmarkFindPII2KB(b *testing.B) {
	text := prose(2<<10-60) + " mail jane@example.com card 4111 1111 1111 1111"
	var buf []Span
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		buf = FindPII(buf[:0], text)
	}
}
