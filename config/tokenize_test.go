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

func TestTokenizeShadowValidation(t *testing.T) {
	for _, c := range []struct {
		sh   TokenizeShadow
		want string // "" = valid; else the key the error must name
	}{
		{TokenizeShadow{}, ""},
		{TokenizeShadow{Fraction: -1}, ""},
		{TokenizeShadow{Fraction: 1, MaxPerSecond: 5, MismatchRate: 1, MinChecks: 3, Timeout: time.Second}, ""},
		{TokenizeShadow{Fraction: 1.5}, "tokenize.shadow.fraction"},
		{TokenizeShadow{MaxPerSecond: -1}, "tokenize.shadow.max_per_second"},
		{TokenizeShadow{MismatchRate: 2}, "tokenize.shadow.mismatch_rate"},
		{TokenizeShadow{MinChecks: -1}, "tokenize.shadow.min_checks"},
		{TokenizeShadow{Timeout: -time.Second}, "tokenize.shadow.timeout"},
	} {
		err := validateTokenize(Tokenize{Shadow: c.sh})
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: unexpected error %v", c.sh, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: error %v, want one naming %s", c.sh, err, c.want)
		}
	}
	if err := validateModels([]Model{{Name: "a", RemoteTokenizeBudget: -time.Second}}); err == nil || !strings.Contains(err.Error(), "remote_tokenize_budget") {
		t.Errorf("negative budget: %v", err)
	}
}

func TestTokenizeHarmonyValidation(t *testing.T) {
	for _, c := range []struct {
		tk   Tokenize
		want string
	}{
		{Tokenize{}, ""},
		{Tokenize{HarmonyTimeZone: "America/Los_Angeles", HarmonyStartDate: "2025-06-28"}, ""},
		{Tokenize{HarmonyTimeZone: "Mars/Olympus"}, "tokenize.harmony_time_zone"},
		{Tokenize{HarmonyStartDate: "28.06.2025"}, "tokenize.harmony_start_date"},
	} {
		err := validateTokenize(c.tk)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: unexpected error %v", c.tk, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: error %v, want one naming %s", c.tk, err, c.want)
		}
	}
}
