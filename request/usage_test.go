package request

import "testing"

func TestWithIncludeUsage(t *testing.T) {
	for _, c := range []struct {
		api        API
		body, want string
		injected   bool
	}{
		{APIChat, `{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}  ` + "\n",
			`{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}  ` + "\n", true},
		{APICompletions, `{"model":"m","stream":true,"prompt":"x"}`,
			`{"model":"m","stream":true,"prompt":"x","stream_options":{"include_usage":true}}`, true},
		{APICompletions, `{"model":"m","stream":true,"prompt":"x","stream_options":null}`, "", false},
		// the client chose: kept as sent
		{APIChat, `{"model":"m","stream":true,"stream_options":{"include_usage":false},"messages":[{"role":"user","content":"x"}]}`, "", false},
		{APIChat, `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}`, "", false},
		{APIChat, `{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true},"messages":[{"role":"user","content":"x"}]}`, "", false},
		// not streamed, or not an OpenAI generation API
		{APIChat, `{"model":"m","messages":[{"role":"user","content":"x"}]}`, "", false},
		{APIMessages, `{"model":"m","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, "", false},
	} {
		r, err := Parse(c.api, []byte(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		got, ok := WithIncludeUsage([]byte(c.body), r)
		want := c.want
		if !c.injected {
			want = c.body
		}
		if ok != c.injected || string(got) != want {
			t.Fatalf("%s:\ngot  %v %s\nwant %v %s", c.body, ok, got, c.injected, want)
		}
		if ok {
			if r2, err := Parse(c.api, got); err != nil || !r2.IncludeUsage {
				t.Fatalf("injected body does not parse with include_usage: %v %+v", err, r2)
			}
		}
	}
}
