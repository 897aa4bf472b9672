package front

import (
	"errors"
	"net/http"
	"testing"

	"github.com/kvroute/kvroute/classify"
	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/router"
)

var chatReq = func() *request.Request {
	r, err := request.Parse(request.APIChat, []byte(`{"model":"m","messages":[{"role":"user","content":"summarize this report for me"}]}`))
	if err != nil {
		panic(err)
	}
	return r
}()

func TestClassifyOffAndRefusal(t *testing.T) {
	if d, err := Classify(nil, nil, classify.Input{Req: chatReq}); err != nil || d.Rule != "" {
		t.Fatalf("off: %+v %v", d, err)
	}
	rs, err := classify.Compile([]classify.RuleSpec{{Name: "no-reports", Regex: "report", Refuse: true}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Classify(rs, nil, classify.Input{Req: chatReq})
	var re *router.Error
	if !d.Refuse || !errors.As(err, &re) || re.Status != http.StatusForbidden {
		t.Fatalf("%+v %v", d, err)
	}
	if rep := ErrorReply(request.APIChat, err); rep.Status != 403 || rep.Details != "kvroute_classify_refused" {
		t.Fatalf("%+v", rep)
	}
}

// BenchmarkClassifyOff is the stage off (classify.rules empty). Both fronts check for
// nil rules before building the stage's input, so off costs them one comparison; this
// is the cost of calling the stage anyway.
func BenchmarkClassifyOff(b *testing.B) {
	in := classify.Input{Path: "/v1/chat/completions", Req: chatReq}
	b.ReportAllocs()
	for b.Loop() {
		Classify(nil, nil, in)
	}
}

// BenchmarkClassifyRegexRule is one regex rule over the last user message, for scale.
func BenchmarkClassifyRegexRule(b *testing.B) {
	rs, _ := classify.Compile([]classify.RuleSpec{{Name: "r", Regex: `(?i)\bdraft\b`, Tag: true}}, nil, nil)
	in := classify.Input{Path: "/v1/chat/completions", Req: chatReq}
	b.ReportAllocs()
	for b.Loop() {
		Classify(rs, nil, in)
	}
}
