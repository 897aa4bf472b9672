package classify

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"
)

const cmdUsage = `Usage:
  kvroute classify train --data LABELLED.jsonl[.gz] --out MODEL [--folds K] [flags]
  kvroute classify eval  --model MODEL --data LABELLED.jsonl[.gz]
  kvroute classify pii   --data SPANS.jsonl

Each prints one JSON object on stdout. Labelled rows are {"text": ..., "label": ...};
span rows are {"text": ..., "spans": [{"type": ..., "start": ..., "end": ...}]} (byte offsets).
`

// Command runs `kvroute classify ARGS` and returns the exit code: 0 success, 1 a failure
// reading or writing files, 2 a usage error.
func Command(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, cmdUsage)
		return 2
	}
	var err error
	switch args[0] {
	case "train":
		err = cmdTrain(args[1:], stdout, stderr)
	case "eval":
		err = cmdEval(args[1:], stdout, stderr)
	case "pii":
		err = cmdPII(args[1:], stdout, stderr)
	case "help", "--help", "-h":
		fmt.Fprint(stdout, cmdUsage)
		return 0
	default:
		fmt.Fprintf(stderr, "kvroute classify: unknown command %q\n\n%s", args[0], cmdUsage)
		return 2
	}
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, pflag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "kvroute classify %s: %v\n", args[0], err)
		return 2
	default:
		fmt.Fprintf(stderr, "kvroute classify %s: %v\n", args[0], err)
		return 1
	}
}

type usageError struct{ error }

func parse(fs *pflag.FlagSet, args []string, stderr io.Writer, required ...string) error {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	for _, name := range required {
		if fs.Lookup(name).Value.String() == "" {
			return usageError{fmt.Errorf("--%s is required", name)}
		}
	}
	return nil
}

// TrainReport is what `kvroute classify train` prints: the data's size and, with
// --folds K, the mean of each fold's evaluation (each fold held out of a model trained
// on the other K-1).
type TrainReport struct {
	Rows   int      `json:"rows"`
	Labels []string `json:"labels"`
	Folds  int      `json:"folds,omitempty"`
	// CV is the mean over folds of accuracy and macro-F1, and each fold's report.
	CVAccuracy float64  `json:"cv_accuracy,omitempty"`
	CVMacroF1  float64  `json:"cv_macro_f1,omitempty"`
	CV         []Report `json:"cv,omitempty"`
	Out        string   `json:"out,omitempty"`
}

func cmdTrain(args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("kvroute classify train", pflag.ContinueOnError)
	def := DefaultTrainOptions()
	data := fs.String("data", "", "labelled JSONL rows {\"text\", \"label\"} (gzip or plain)")
	out := fs.String("out", "", "model file to write (empty with --folds: evaluate only)")
	folds := fs.Int("folds", 0, "cross-validate over K folds (split by a hash of each text) before training on all rows")
	epochs := fs.Int("epochs", def.Epochs, "passes over the data")
	lr := fs.Float64("lr", def.LearningRate, "initial SGD learning rate (decays linearly to 0)")
	l2 := fs.Float64("l2", def.L2, "weight decay per step on touched weights")
	balanced := fs.Bool("balanced", def.Balanced, "weigh rows by the inverse frequency of their label")
	nb := fs.Float64("nb", def.NB, "naive-Bayes log-count ratio features, smoothed by this count (0: plain logistic)")
	maxRows := fs.Int("max-rows", def.MaxRows, "keep only this many features, those of largest weight (0: all)")
	seed := fs.Uint64("seed", def.Seed, "shuffle seed")
	bits := fs.Uint8("bits", def.Features.Bits, "log2 of the hashed feature space")
	ngrams := fs.Int("word-ngrams", def.Features.WordNgrams, "1: words; 2: words and word bigrams")
	cmin := fs.Int("char-min", def.Features.CharMin, "shortest character n-gram")
	cmax := fs.Int("char-max", def.Features.CharMax, "longest character n-gram (0: none)")
	window := fs.Int("window", def.Features.WindowBytes, "bytes of each text read (0: all)")
	if err := parse(fs, args, stderr, "data"); err != nil {
		return err
	}
	if *out == "" && *folds == 0 {
		return usageError{errors.New("--out is required (or --folds K to only cross-validate)")}
	}
	if *folds == 1 || *folds < 0 || *folds > 20 {
		return usageError{fmt.Errorf("--folds %d, want 0 or 2..20", *folds)}
	}
	opt := TrainOptions{Epochs: *epochs, LearningRate: *lr, L2: *l2, Seed: *seed, Balanced: *balanced, NB: *nb, MaxRows: *maxRows,
		Features: Features{Bits: *bits, WordNgrams: *ngrams, CharMin: *cmin, CharMax: *cmax, WindowBytes: *window}}
	if err := opt.Features.validate(); err != nil {
		return usageError{err}
	}
	rows, err := ReadRows(*data)
	if err != nil {
		return err
	}
	rep := TrainReport{Rows: len(rows), Labels: labelSet(rows), Folds: *folds}
	if *folds > 0 {
		reps, err := CrossValidate(rows, *folds, opt)
		if err != nil {
			return err
		}
		for _, r := range reps {
			rep.CVAccuracy += r.Accuracy / float64(len(reps))
			rep.CVMacroF1 += r.MacroF1 / float64(len(reps))
		}
		rep.CVAccuracy, rep.CVMacroF1, rep.CV = round3(rep.CVAccuracy), round3(rep.CVMacroF1), reps
	}
	if *out != "" {
		m, err := Train(rows, opt)
		if err != nil {
			return err
		}
		if err := m.Save(*out); err != nil {
			return err
		}
		rep.Out = *out
	}
	return printJSON(stdout, rep)
}

// CrossValidate trains k models, each on all folds but one (Folds), and evaluates each
// on the fold it did not see, after a Save/Load round trip so the quantized weights are
// what is measured.
func CrossValidate(rows []Row, k int, opt TrainOptions) ([]Report, error) {
	var out []Report
	for _, fold := range Folds(rows, k) {
		held := make(map[int]bool, len(fold))
		for _, i := range fold {
			held[i] = true
		}
		var train, test []Row
		for i, r := range rows {
			if held[i] {
				test = append(test, r)
			} else {
				train = append(train, r)
			}
		}
		if len(test) == 0 {
			continue
		}
		m, err := Train(train, opt)
		if err != nil {
			return nil, err
		}
		m, err = roundTrip(m)
		if err != nil {
			return nil, err
		}
		out = append(out, Evaluate(m, test))
	}
	return out, nil
}

func cmdEval(args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("kvroute classify eval", pflag.ContinueOnError)
	model := fs.String("model", "", "model file written by \"kvroute classify train\"")
	data := fs.String("data", "", "labelled JSONL rows {\"text\", \"label\"} (gzip or plain)")
	if err := parse(fs, args, stderr, "model", "data"); err != nil {
		return err
	}
	m, err := Load(*model)
	if err != nil {
		return err
	}
	rows, err := ReadRows(*data)
	if err != nil {
		return err
	}
	return printJSON(stdout, Evaluate(m, rows))
}

func printJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
