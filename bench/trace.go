package bench

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"time"
)

// DefaultTracePath is the Mooncake conversation trace shipped with the repository
// (bench/traces/README.md gives its source and licence), relative to the repository root.
const DefaultTracePath = "bench/traces/mooncake_conversation_trace.jsonl.gz"

// OpenTrace opens a trace file for ParseMooncake; a name ending in .gz is decompressed.
// The caller closes the result, which closes the file too.
func OpenTrace(path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(path, ".gz") {
		return f, nil
	}
	z, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: %s: %v", ErrTrace, path, err)
	}
	return gzipFile{z, f}, nil
}

// gzipFile closes both the decompressor and the file under it.
type gzipFile struct {
	*gzip.Reader
	f *os.File
}

func (g gzipFile) Close() error {
	err := g.Reader.Close()
	if ferr := g.f.Close(); err == nil {
		err = ferr
	}
	return err
}

// MooncakeBlockTokens is the number of tokens one Mooncake hash id stands for.
const MooncakeBlockTokens = 512

// ErrTrace is wrapped by trace parsing errors.
var ErrTrace = errors.New("bench: bad trace")

// TraceOptions controls Mooncake trace replay.
type TraceOptions struct {
	Limit int     // first N requests; 0 = all
	Speed float64 // time compression: 2 replays twice as fast; 0 means 1
	// MaxDuration drops requests arriving later than this (after Speed); 0 = no limit.
	MaxDuration time.Duration
}

type mooncakeLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

// HashIDTokens returns the fixed run of MooncakeBlockTokens token ids a Mooncake hash
// id stands for: the same id always gives the same tokens, different ids differ.
func HashIDTokens(id int64) []uint32 {
	r := rand.New(rand.NewPCG(uint64(id), 0x6d6f6f6e))
	return randTokens(r, MooncakeBlockTokens)
}

// ParseMooncake reads the Mooncake trace format (one JSON object per line: timestamp
// in ms, input_length, output_length, hash_ids of 512-token blocks) into a workload of
// token-id prompts cut to input_length.
func ParseMooncake(rd io.Reader, o TraceOptions) (*Workload, error) {
	if o.Speed <= 0 {
		o.Speed = 1
	}
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	w := &Workload{Name: "mooncake"}
	runs := map[int64][]uint32{}
	line := 0
	for sc.Scan() {
		line++
		if len(sc.Bytes()) == 0 {
			continue
		}
		var l mooncakeLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrTrace, line, err)
		}
		if l.Timestamp == nil || l.InputLength <= 0 || len(l.HashIDs) == 0 {
			return nil, fmt.Errorf("%w: line %d: timestamp, input_length > 0 and hash_ids are required", ErrTrace, line)
		}
		if need := (l.InputLength + MooncakeBlockTokens - 1) / MooncakeBlockTokens; len(l.HashIDs) < need {
			return nil, fmt.Errorf("%w: line %d: %d hash_ids cannot cover %d tokens", ErrTrace, line, len(l.HashIDs), l.InputLength)
		}
		at := time.Duration(*l.Timestamp / o.Speed * float64(time.Millisecond))
		if o.MaxDuration > 0 && at > o.MaxDuration {
			break
		}
		prompt := make([]uint32, 0, len(l.HashIDs)*MooncakeBlockTokens)
		for _, h := range l.HashIDs {
			run, ok := runs[h]
			if !ok {
				run = HashIDTokens(h)
				runs[h] = run
			}
			prompt = append(prompt, run...)
		}
		w.Items = append(w.Items, Item{At: at, Conv: -1, Prompt: prompt[:l.InputLength], MaxTokens: max(l.OutputLength, 1),
			Group: "h" + itoa(int(l.HashIDs[0]))})
		if o.Limit > 0 && len(w.Items) >= o.Limit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTrace, err)
	}
	return w, nil
}
