package tokenize

import (
	"context"

	"github.com/kvroute/kvroute/request"
)

// Path names how a request's token ids were obtained.
type Path string

const (
	PathGiven  Path = "given"  // the request carried token ids (completions prompt)
	PathLocal  Path = "local"  // in-process tokenizer and chat template
	PathRemote Path = "remote" // the worker's own POST /tokenize
	PathNone   Path = "none"   // no ids: the pick is made on load alone ("degraded")
)

// Result is a tokenized request.
type Result struct {
	// Tokens are the ids of the (first) prompt, used for prefix lookup. Callers must not
	// modify them (they may be shared with a cache).
	Tokens []uint32
	// PromptTokens is the prompt length in tokens over all prompts of the request
	// (a completions request may carry several). 0 when Path is PathNone.
	PromptTokens int
	Path         Path
	// Degraded says why no ids are available when Path is PathNone, e.g.
	// "no_tokenizer", "template_error", "remote_failed".
	Degraded string
}

// Tokenizer produces engine-exact token ids for a request. Implementations must be
// safe for concurrent use. An error means no path worked; callers then pick on load
// alone and count the degraded pick. ctx bounds remote calls.
type Tokenizer interface {
	Tokenize(ctx context.Context, req *request.Request) (Result, error)
}

// Shadower is a Tokenizer that can check the ids its local path produced against the
// worker picked for the request (Service: the shadow check, shadow.go). The router
// calls Shadow after booking; it must return at once and not keep tokens' owner
// waiting (the check runs off the request path).
type Shadower interface {
	Shadow(req *request.Request, path Path, tokens []uint32, workerAddress string)
}

// GivenOnly uses token ids the request already carries and reports every other request
// as degraded. It is the fallback when no model has a tokenizer configured.
type GivenOnly struct{}

// Tokenize implements Tokenizer.
func (GivenOnly) Tokenize(_ context.Context, req *request.Request) (Result, error) {
	if res, ok := given(req); ok {
		return res, nil
	}
	return Result{Path: PathNone, Degraded: "no_tokenizer"}, nil
}

// given is the PathGiven result of a request that carries token ids.
func given(req *request.Request) (Result, bool) {
	if len(req.PromptTokenIDs) == 0 {
		return Result{}, false
	}
	n := 0
	for _, p := range req.PromptTokenIDs {
		n += len(p)
	}
	return Result{Tokens: req.PromptTokenIDs[0], PromptTokens: n, Path: PathGiven}, true
}
