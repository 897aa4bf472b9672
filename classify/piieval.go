package classify

import (
	"fmt"
	"io"

	"github.com/spf13/pflag"
)

// PIIRow is one labelled text of a PII evaluation set; spans are byte offsets.
type PIIRow struct {
	Text  string `json:"text"`
	Spans []Span `json:"spans"`
}

// PIIScore is precision and recall over spans: a found span is correct, and a labelled
// span recalled, when a span of the other side has the same type and overlaps it.
type PIIScore struct {
	Precision float64 `json:"precision"`
	Recall    float64 `json:"recall"`
	Found     int     `json:"found"`
	Labelled  int     `json:"labelled"`
}

// PIIReport is what `kvroute classify pii` prints.
type PIIReport struct {
	Rows    int                 `json:"rows"`
	Overall PIIScore            `json:"overall"`
	PerType map[string]PIIScore `json:"per_type"`
}

// ReadPIIRows reads span rows from path (gzip or plain); a span outside its text or of
// an unknown type is an error naming its line.
func ReadPIIRows(path string) ([]PIIRow, error) {
	known := map[string]bool{}
	for _, t := range PIITypes {
		known[t] = true
	}
	return readJSONL(path, func(r *PIIRow) error {
		for _, s := range r.Spans {
			if !known[s.Type] {
				return fmt.Errorf("span type %q is not one of %v", s.Type, PIITypes)
			}
			if s.Start < 0 || s.End <= s.Start || s.End > len(r.Text) {
				return fmt.Errorf("span [%d, %d) outside the text's %d bytes", s.Start, s.End, len(r.Text))
			}
		}
		return nil
	})
}

// EvaluatePII runs FindPII over every row and scores it against the labelled spans.
func EvaluatePII(rows []PIIRow) PIIReport {
	type counts struct{ foundOK, found, gotOK, labelled int }
	per := map[string]*counts{}
	for _, t := range PIITypes {
		per[t] = &counts{}
	}
	var buf []Span
	for _, r := range rows {
		buf = FindPII(buf[:0], r.Text)
		for _, f := range buf {
			c := per[f.Type]
			c.found++
			if matchSpan(f, r.Spans) {
				c.foundOK++
			}
		}
		for _, l := range r.Spans {
			c := per[l.Type]
			c.labelled++
			if matchSpan(l, buf) {
				c.gotOK++
			}
		}
	}
	rep := PIIReport{Rows: len(rows), PerType: map[string]PIIScore{}}
	var all counts
	score := func(c counts) PIIScore {
		s := PIIScore{Precision: 1, Recall: 1, Found: c.found, Labelled: c.labelled}
		if c.found > 0 {
			s.Precision = round3(float64(c.foundOK) / float64(c.found))
		}
		if c.labelled > 0 {
			s.Recall = round3(float64(c.gotOK) / float64(c.labelled))
		}
		return s
	}
	for t, c := range per {
		rep.PerType[t] = score(*c)
		all.foundOK += c.foundOK
		all.found += c.found
		all.gotOK += c.gotOK
		all.labelled += c.labelled
	}
	rep.Overall = score(all)
	return rep
}

func matchSpan(s Span, in []Span) bool {
	for _, o := range in {
		if o.Type == s.Type && s.Start < o.End && o.Start < s.End {
			return true
		}
	}
	return false
}

func cmdPII(args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("kvroute classify pii", pflag.ContinueOnError)
	data := fs.String("data", "", "span rows {\"text\", \"spans\": [{\"type\", \"start\", \"end\"}]} (gzip or plain)")
	if err := parse(fs, args, stderr, "data"); err != nil {
		return err
	}
	rows, err := ReadPIIRows(*data)
	if err != nil {
		return err
	}
	return printJSON(stdout, EvaluatePII(rows))
}
