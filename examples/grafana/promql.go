// Package grafana holds kvroute's Grafana dashboards (dashboards/*.json) and their
// provisioning; the test checks every PromQL expression against the metrics kvroute and
// vLLM export. This file is the small PromQL scanner the test uses.
package grafana

import (
	"fmt"
	"strings"
	"unicode"
)

// Selector is one metric selector of an expression: the metric name and the label
// names its matchers use.
type Selector struct {
	Metric string
	Labels []string
}

// Refs are the metric references of one PromQL expression.
type Refs struct {
	Selectors []Selector
	// Grouping are label names of by/without/on/ignoring/group_left/group_right clauses.
	Grouping []string
}

// keywords are PromQL words that are neither metric names nor functions.
var keywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
	"inf": true, "nan": true, "Inf": true, "NaN": true,
	// Aggregation operators are reserved words too; they may be followed by a by/without
	// clause before their parenthesis ("sum by (le) (…)").
	"sum": true, "avg": true, "min": true, "max": true, "count": true, "stddev": true, "stdvar": true,
	"topk": true, "bottomk": true, "quantile": true, "count_values": true, "group": true,
	"limitk": true, "limit_ratio": true,
}

var groupingWords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// Scan extracts the metric selectors and grouping labels of a PromQL expression. It is
// a scanner, not a parser: it understands identifiers, function calls, label matchers
// ({…}), ranges and subqueries ([…]), strings, numbers and Grafana $variables, which is
// all a dashboard expression uses. An identifier followed by "(" is a function or an
// aggregation; any other identifier that is not a keyword is a metric name.
func Scan(expr string) (Refs, error) {
	var r Refs
	s := []rune(expr)
	i := 0
	skipSpace := func() {
		for i < len(s) && unicode.IsSpace(s[i]) {
			i++
		}
	}
	ident := func() string {
		j := i
		for i < len(s) && (s[i] == '_' || s[i] == ':' || unicode.IsLetter(s[i]) || (i > j && unicode.IsDigit(s[i]))) {
			i++
		}
		return string(s[j:i])
	}
	str := func() error {
		q := s[i]
		i++
		for i < len(s) && s[i] != q {
			if s[i] == '\\' && q != '`' {
				i++
			}
			i++
		}
		if i >= len(s) {
			return fmt.Errorf("promql: unterminated string in %q", expr)
		}
		i++
		return nil
	}
	// matchers reads {name op "value", …} and returns the names (and the metric from
	// __name__ if given).
	matchers := func() ([]string, string, error) {
		i++ // {
		var names []string
		metric := ""
		for {
			skipSpace()
			if i >= len(s) {
				return nil, "", fmt.Errorf("promql: unterminated {…} in %q", expr)
			}
			if s[i] == '}' {
				i++
				return names, metric, nil
			}
			if s[i] == ',' {
				i++
				continue
			}
			name := ident()
			if name == "" {
				return nil, "", fmt.Errorf("promql: bad label matcher at %d in %q", i, expr)
			}
			skipSpace()
			for i < len(s) && strings.ContainsRune("=!~", s[i]) {
				i++
			}
			skipSpace()
			if i >= len(s) || !strings.ContainsRune("\"'`", s[i]) {
				return nil, "", fmt.Errorf("promql: label %s needs a quoted value in %q", name, expr)
			}
			start := i
			if err := str(); err != nil {
				return nil, "", err
			}
			if name == "__name__" {
				metric = strings.Trim(string(s[start:i]), "\"'`")
				continue
			}
			names = append(names, name)
		}
	}
	for i < len(s) {
		c := s[i]
		switch {
		case unicode.IsSpace(c):
			i++
		case c == '"' || c == '\'' || c == '`':
			if err := str(); err != nil {
				return r, err
			}
		case c == '[':
			for i < len(s) && s[i] != ']' {
				i++
			}
			i++
		case c == '$':
			i++
			if i < len(s) && s[i] == '{' {
				for i < len(s) && s[i] != '}' {
					i++
				}
				i++
			} else {
				ident()
			}
		case c == '{':
			names, metric, err := matchers()
			if err != nil {
				return r, err
			}
			if metric == "" {
				return r, fmt.Errorf("promql: selector without a metric name in %q", expr)
			}
			r.Selectors = append(r.Selectors, Selector{Metric: metric, Labels: names})
		case unicode.IsDigit(c) || (c == '.' && i+1 < len(s) && unicode.IsDigit(s[i+1])):
			for i < len(s) && (unicode.IsDigit(s[i]) || unicode.IsLetter(s[i]) || s[i] == '.') {
				i++
			}
		case c == '_' || c == ':' || unicode.IsLetter(c):
			name := ident()
			skipSpace()
			next := rune(0)
			if i < len(s) {
				next = s[i]
			}
			switch {
			case groupingWords[name] && next == '(':
				i++
				for {
					skipSpace()
					if i >= len(s) {
						return r, fmt.Errorf("promql: unterminated %s (…) in %q", name, expr)
					}
					if s[i] == ')' {
						i++
						break
					}
					if s[i] == ',' {
						i++
						continue
					}
					l := ident()
					if l == "" {
						return r, fmt.Errorf("promql: bad label list after %s in %q", name, expr)
					}
					r.Grouping = append(r.Grouping, l)
				}
			case keywords[name]:
			case next == '(':
				// function or aggregation
			default:
				sel := Selector{Metric: name}
				if next == '{' {
					names, metric, err := matchers()
					if err != nil {
						return r, err
					}
					if metric != "" {
						return r, fmt.Errorf("promql: metric %s also has __name__ in %q", name, expr)
					}
					sel.Labels = names
				}
				r.Selectors = append(r.Selectors, sel)
			}
		default:
			i++
		}
	}
	return r, nil
}
