package classify

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/request"
)

func chat(t *testing.T, body string) *request.Request {
	t.Helper()
	r, err := request.Parse(request.APIChat, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func fixtureModel(t *testing.T) *Linear {
	t.Helper()
	rows, err := ReadRows(fixture)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Train(rows, smallOptions())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCompileRejectsBadRules(t *testing.T) {
	m := fixtureModel(t)
	cases := map[string]RuleSpec{
		"needs a name":                 {Labels: []string{"math"}, Tag: true},
		"no match field":               {Name: "a", Tag: true},
		"no action":                    {Name: "a", Labels: []string{"math"}},
		"cannot be combined":           {Name: "a", Labels: []string{"math"}, Refuse: true, Class: "batch"},
		"class, workers or model":      {Name: "a", Regex: "x", Refuse: true, Model: "small"},
		"not an ip:port":               {Name: "a", Regex: "x", Workers: []string{"w1"}},
		"not one of admission.classes": {Name: "a", Labels: []string{"math"}, Class: "gold"},
		"not one of the model's":       {Name: "a", Labels: []string{"poetry"}, Tag: true},
		"pii type":                     {Name: "a", PII: []string{"passport"}, Refuse: true},
		"regex":                        {Name: "a", Regex: "(", Tag: true},
		"over":                         {Name: "a", Regex: "x", Over: "assistant", Tag: true},
		"min_confidence":               {Name: "a", Labels: []string{"math"}, MinConfidence: 2, Tag: true},
		"has no name":                  {Name: "a", Header: "=v", Tag: true},
	}
	for want, spec := range cases {
		_, err := Compile([]RuleSpec{spec}, m, []string{"batch"})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: err %v, want one containing %q", spec, err, want)
		}
	}
	if _, err := Compile([]RuleSpec{{Name: "a", Labels: []string{"math"}, Tag: true}}, nil, nil); err == nil || !strings.Contains(err.Error(), "classify.model") {
		t.Errorf("labels without a model: %v", err)
	}
	if _, err := Compile([]RuleSpec{{Name: "a", Regex: "x", Tag: true}, {Name: "a", Regex: "y", Tag: true}}, m, nil); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate names: %v", err)
	}
}

func TestDecideFirstMatchWins(t *testing.T) {
	rows, _ := ReadRows(fixture)
	var mathQ, lawQ string
	for _, r := range rows {
		if r.Label == "math" && mathQ == "" {
			mathQ = r.Text
		}
		if r.Label == "law" && lawQ == "" {
			lawQ = r.Text
		}
	}
	m := fixtureModel(t)
	rs, err := Compile([]RuleSpec{
		{Name: "secrets", PII: []string{PIIAWSKey, PIIPrivateKey}, Refuse: true},
		{Name: "internal", Header: "x-team=research", Regex: `(?i)\bdraft\b`, Over: "both", Tag: true},
		{Name: "stem", Labels: []string{"math", "computer science"}, Class: "batch", Tag: true},
		{Name: "vip", Tenants: []string{"acme"}, Paths: []string{"/v1/chat/completions"}, Class: "interactive"},
	}, m, []string{"batch", "interactive"})
	if err != nil {
		t.Fatal(err)
	}
	body := func(sys, user string) string {
		return `{"model":"m","messages":[{"role":"system","content":` + quote(sys) + `},{"role":"assistant","content":"hi"},{"role":"user","content":[{"type":"text","text":` + quote(user) + `}]}]}`
	}
	hdr := func(kv ...string) func(string) string {
		return func(n string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == n {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	d := rs.Decide(Input{Req: chat(t, body("be brief", "my key is AKIAIOSFODNN7EXAMPLE"))})
	if d.Rule != "secrets" || !d.Refuse || d.Action() != "refuse" {
		t.Errorf("secret: %+v", d)
	}
	d = rs.Decide(Input{Req: chat(t, body("this is a DRAFT", lawQ)), Header: hdr("x-team", "research")})
	if d.Rule != "internal" || len(d.Header) != 1 || d.Header[0][0] != TagHeader || !strings.HasPrefix(d.Header[0][1], "rule=internal; label=") {
		t.Errorf("header+regex over both: %+v", d)
	}
	if d := rs.Decide(Input{Req: chat(t, body("this is a DRAFT", lawQ)), Header: hdr("x-team", "sales")}); d.Rule == "internal" {
		t.Errorf("header value differs but matched: %+v", d)
	}
	d = rs.Decide(Input{Req: chat(t, body("", mathQ))})
	if d.Rule != "stem" || d.Class != "batch" || d.Label != "math" || d.Action() != "class" {
		t.Errorf("math question: %+v", d)
	}
	d = rs.Decide(Input{Req: chat(t, body("", lawQ)), Tenant: "acme", Path: "/v1/chat/completions"})
	if d.Rule != "vip" || d.Class != "interactive" || d.Label != "law" {
		t.Errorf("tenant rule: %+v", d)
	}
	d = rs.Decide(Input{Req: chat(t, body("", lawQ)), Tenant: "other", Path: "/v1/chat/completions"})
	if d.Rule != "" || d.Action() != "none" || d.Label != "law" || d.Confidence <= 0 {
		t.Errorf("no rule: %+v", d)
	}
}

func TestDecideCompletionsAndAnthropicSystem(t *testing.T) {
	rs, err := Compile([]RuleSpec{{Name: "sys", Regex: "pirate", Over: "system", Tag: true}, {Name: "p", Regex: "^SELECT", Refuse: true}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := request.Parse(request.APIMessages, []byte(`{"model":"c","max_tokens":5,"system":[{"type":"text","text":"talk like a pirate"}],"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if d := rs.Decide(Input{Req: msg}); d.Rule != "sys" {
		t.Errorf("anthropic system: %+v", d)
	}
	cmp, err := request.Parse(request.APICompletions, []byte(`{"model":"c","prompt":["a","SELECT * FROM t"]}`))
	if err != nil {
		t.Fatal(err)
	}
	if d := rs.Decide(Input{Req: cmp}); d.Rule != "p" || !d.Refuse {
		t.Errorf("completions prompt: %+v", d)
	}
	if d := rs.Decide(Input{}); d.Rule != "" {
		t.Errorf("no request: %+v", d)
	}
}

func quote(s string) string {
	var sb strings.Builder
	sb.WriteByte('"')
	for _, c := range s {
		switch c {
		case '"', '\\':
			sb.WriteByte('\\')
			sb.WriteRune(c)
		case '\n':
			sb.WriteString(`\n`)
		default:
			sb.WriteRune(c)
		}
	}
	sb.WriteByte('"')
	return sb.String()
}
