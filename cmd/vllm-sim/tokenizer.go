package main

import (
	"encoding/json"
	"errors"

	"github.com/kvroute/kvroute/request"
	"github.com/kvroute/kvroute/tokenize"
)

// realTokens returns a sim.WorkerOptions.TextTokens that tokenizes like vLLM with the
// tokenizer.json and chat template in dir (package tokenize): chat requests are
// rendered with the template, completions text is encoded with special tokens.
// A body without "model" (as /tokenize allows) is given model.
func realTokens(dir, model string) (func(chat bool, body []byte) ([]uint32, error), error) {
	m, err := tokenize.LoadModel(dir, tokenize.Options{})
	if err != nil {
		return nil, err
	}
	return func(chat bool, body []byte) ([]uint32, error) {
		api := request.APICompletions
		if chat {
			api = request.APIChat
		}
		var m0 map[string]any
		if json.Unmarshal(body, &m0) == nil && m0["model"] == nil {
			m0["model"] = model
			body, _ = json.Marshal(m0)
		}
		req, err := request.Parse(api, body)
		if err != nil {
			return nil, err
		}
		ids, err := tokenize.LocalTokens(m, req)
		if err != nil {
			return nil, err
		}
		if len(ids) != 1 {
			return nil, errors.New("exactly one prompt is supported")
		}
		return ids[0], nil
	}, nil
}
