// Package bench generates workloads (shared prefix, multi-turn, Mooncake trace replay),
// runs them against OpenAI endpoints over HTTP or against a virtual-time cluster of
// simulated vLLM engines behind kvroute's router core, and reports statistics, tables,
// JSON and SVG plots.
package bench

import (
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute/sim"
)

// Message is one chat message given as token ids (rendered as stand-in "t<id>" text
// when sent as chat over HTTP).
type Message struct {
	Role   string
	Tokens []uint32
}

// Item is one request of a workload.
type Item struct {
	// At is the arrival offset from the start of the run (open-loop arrivals). For a
	// conversation turn after the first it is ignored: the turn starts Think after the
	// previous turn completes.
	At time.Duration
	// Conv numbers the conversation the item belongs to (-1: none); Turn counts from 0.
	Conv, Turn int
	Think      time.Duration
	// Either Messages (chat) or Prompt (raw token ids) is set.
	Messages  []Message
	Prompt    []uint32
	MaxTokens int    // output tokens, generated with ignore_eos
	Group     string // label, e.g. the shared prefix used
	// Adapter is the LoRA adapter the request names as its model ("" the base model).
	Adapter string
}

// EngineTokens returns the token ids the simulated engine computes for it: the prompt,
// or the messages through the stand-in ChatML template.
func (it *Item) EngineTokens() []uint32 {
	if it.Messages == nil {
		return it.Prompt
	}
	msgs := make([]sim.ChatMessage, len(it.Messages))
	for i, m := range it.Messages {
		msgs[i] = sim.ChatMessage{Role: m.Role, Content: sim.TokensText(m.Tokens)}
	}
	return sim.StandIn{}.Chat(msgs, true)
}

// Workload is an ordered list of items (by At for open-loop items).
type Workload struct {
	Name  string
	Items []Item
}

// randTokens returns n token ids from r in the range the stand-in tokenizer maps 1:1.
func randTokens(r *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = 1000 + uint32(r.IntN(100000))
	}
	return out
}

// SharedPrefixOptions describes GuideLLM's shared-prefix synthetic data: K prefixes of
// P tokens sent as the system message, a unique user suffix of S tokens, O output tokens.
type SharedPrefixOptions struct {
	Prefixes     int // K
	PrefixTokens int // P
	SuffixTokens int // S
	OutputTokens int // O
	Requests     int
	// Skew > 1 draws prefixes from a Zipf law with this exponent instead of uniformly:
	// a few hot prefixes, as with production system prompts. 0 = uniform (GuideLLM).
	Skew float64
	Seed uint64
}

// SharedPrefix builds the workload; each request draws its prefix at random
// (uniformly, or Zipf-skewed when Skew > 1).
func SharedPrefix(o SharedPrefixOptions) *Workload {
	r := rand.New(rand.NewPCG(o.Seed, 0x5eed))
	prefixes := make([][]uint32, o.Prefixes)
	for i := range prefixes {
		prefixes[i] = randTokens(r, o.PrefixTokens)
	}
	w := &Workload{Name: "shared-prefix"}
	var z *rand.Zipf
	if o.Skew > 1 && o.Prefixes > 1 {
		z = rand.NewZipf(r, o.Skew, 1, uint64(o.Prefixes-1))
	}
	for i := 0; i < o.Requests; i++ {
		k := 0
		if z != nil {
			k = int(z.Uint64())
		} else {
			k = r.IntN(o.Prefixes)
		}
		w.Items = append(w.Items, Item{Conv: -1, MaxTokens: o.OutputTokens, Group: "prefix-" + itoa(k),
			Messages: []Message{{Role: "system", Tokens: prefixes[k]}, {Role: "user", Tokens: randTokens(r, o.SuffixTokens)}}})
	}
	return w
}

// MultiTurnOptions describes conversations that grow turn by turn.
type MultiTurnOptions struct {
	Conversations int
	Turns         int
	SystemTokens  int // shared by all conversations
	UserTokens    int // per turn
	OutputTokens  int // per turn
	Think         time.Duration
	Seed          uint64
}

// MultiTurn builds conversations: turn t sends the system prompt, every earlier user
// message and assistant reply, and a new user message. Assistant replies in later
// prompts are the workload's own deterministic tokens (not the engine's output), so
// the prompts are fixed in advance and equal across targets; the reuse measured is
// that of the earlier prompts.
func MultiTurn(o MultiTurnOptions) *Workload {
	r := rand.New(rand.NewPCG(o.Seed, 0x7075))
	sys := randTokens(r, o.SystemTokens)
	w := &Workload{Name: "multi-turn"}
	for c := 0; c < o.Conversations; c++ {
		msgs := []Message{{Role: "system", Tokens: sys}}
		for t := 0; t < o.Turns; t++ {
			msgs = append(msgs, Message{Role: "user", Tokens: randTokens(r, o.UserTokens)})
			it := Item{Conv: c, Turn: t, Think: o.Think, MaxTokens: o.OutputTokens, Group: "conv-" + itoa(c),
				Messages: append([]Message(nil), msgs...)}
			w.Items = append(w.Items, it)
			msgs = append(msgs, Message{Role: "assistant", Tokens: randTokens(r, o.OutputTokens)})
		}
	}
	return w
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b [20]byte
	n := len(b)
	neg := i < 0
	if neg {
		i = -i
	}
	for i > 0 {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
	}
	if neg {
		n--
		b[n] = '-'
	}
	return string(b[n:])
}
