package router

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/workers"
)

// Issue 10 item 14: a 404 for an unknown model echoes at most maxEchoedModel bytes of
// the client's model name, cut on a UTF-8 boundary.
func TestUnknownModel404TruncatesEcho(t *testing.T) {
	reg := workers.NewRegistry()
	reg.Set([]*workers.Worker{{Name: "w", Address: "10.0.0.1:8000", Models: []string{"m"}}})
	r := New(Options{Registry: reg, Models: []Model{{Name: "m"}}})
	long := strings.Repeat("é", 50_000) // 100 KB of two-byte runes
	_, err := r.Pick(context.Background(), &request.Request{API: request.APIOther, Model: long}, PickOptions{})
	var re *Error
	if !errors.As(err, &re) || re.Status != 404 {
		t.Fatalf("want a 404, got %v", err)
	}
	if len(re.Message) > maxEchoedModel+64 || !utf8.ValidString(re.Message) || !strings.Contains(re.Message, "…") {
		t.Fatalf("404 message is %d bytes (valid UTF-8 %v): %.80q", len(re.Message), utf8.ValidString(re.Message), re.Message)
	}
	if _, err := r.Pick(context.Background(), &request.Request{API: request.APIOther, Model: "short-name"}, PickOptions{}); err == nil || !strings.Contains(err.Error(), "`short-name`") {
		t.Fatalf("a short name is echoed whole: %v", err)
	}
}
