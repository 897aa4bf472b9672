package config

import (
	"strings"
	"testing"
	"time"
)

func TestTokenizePathsValidation(t *testing.T) {
	for _, c := range []struct {
		m    Model
		want string // "" = valid; else the key the error must name
	}{
		{Model{Name: "a", Tokenizer: "/t", TokenizePaths: []string{"local", "remote"}}, ""},
		{Model{Name: "a", TokenizePaths: []string{"remote"}}, ""},
		{Model{Name: "a", TokenizePaths: []string{"local"}}, "models[0].tokenize_paths[0]"},
		{Model{Name: "a", Tokenizer: "/t", TokenizePaths: []string{"magic"}}, "models[0].tokenize_paths[0]"},
		{Model{Name: "a", TokenizePaths: []string{"remote", "remote"}}, "models[0].tokenize_paths[1]"},
		{Model{Name: "a", RemoteTokenizeTimeout: -time.Second}, "models[0].remote_tokenize_timeout"},
	} {
		err := validateModels([]Model{c.m})
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: unexpected error %v", c.m, err)
		case c.want != "" && (err == nil || !strings.HasPrefix(err.Error(), c.want+":")):
			t.Errorf("%+v: error %v, want one naming %s", c.m, err, c.want)
		}
	}
}
