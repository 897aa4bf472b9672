package peers

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/kvroute/kvroute/kvindex"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

var testLimits = Limits{MaxWorkers: 16, MaxKeysPerWorker: 64, MaxNameBytes: maxNameBytes}

func sampleSummary() *Summary {
	return &Summary{Replica: "r1", Incarnation: 7, Seq: 42, Sent: time.UnixMilli(1_700_000_000_123),
		Workers: []WorkerSummary{
			{Worker: "w0", Booked: scoring.Booked{Requests: 3, Prefilling: 2, PrefillTokens: 4000, Decoding: 1},
				OldestPrefill: time.UnixMilli(1_700_000_000_000), Keys: []kvindex.Key{1, 2, 1<<64 - 1},
				Writes: 12345, FirstTokens: []time.Time{time.UnixMilli(1_699_999_999_000), time.UnixMilli(1_700_000_000_100)},
				Finished: []time.Time{time.UnixMilli(1_700_000_000_123)}},
			{Worker: "w1", Booked: scoring.Booked{Requests: 1, Decoding: 1}},
		}}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	s := sampleSummary()
	b := encode(nil, s)
	got, err := decode(b, testLimits)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, s) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, s)
	}
}

func TestDecodeRejectsBeforeAllocating(t *testing.T) {
	good := encode(nil, sampleSummary())
	tooManyKeys := sampleSummary()
	tooManyKeys.Workers[0].Keys = make([]kvindex.Key, testLimits.MaxKeysPerWorker+1)
	tooManyWorkers := sampleSummary()
	tooManyWorkers.Workers = make([]WorkerSummary, testLimits.MaxWorkers+1)
	for i := range tooManyWorkers.Workers {
		tooManyWorkers.Workers[i].Worker = "w"
	}
	// A summary claiming 16 workers in a handful of bytes: rejected by the bytes left.
	lying := encode(nil, &Summary{Replica: "r", Seq: 1})
	lying[len(lying)-1] = 16
	// A worker claiming 60 keys with none following (its last 4 bytes: n_keys, writes,
	// n_first, n_finished).
	lyingKeys := encode(nil, &Summary{Replica: "r", Seq: 1, Workers: []WorkerSummary{{Worker: "w"}}})
	lyingKeys[len(lyingKeys)-4] = 60
	// A worker claiming 60 finish times with none following.
	lyingEvents := encode(nil, &Summary{Replica: "r", Seq: 1, Workers: []WorkerSummary{{Worker: "w"}}})
	lyingEvents[len(lyingEvents)-1] = 60
	tooManyEvents := sampleSummary()
	tooManyEvents.Workers[1].FirstTokens = make([]time.Time, router.MaxLeftEvents+1)
	for name, b := range map[string][]byte{
		"empty":            nil,
		"version":          append([]byte{9}, good[1:]...),
		"truncated":        good[:len(good)-3],
		"trailing":         append(append([]byte(nil), good...), 0),
		"too many keys":    encode(nil, tooManyKeys),
		"too many workers": encode(nil, tooManyWorkers),
		"workers vs bytes": lying,
		"keys vs bytes":    lyingKeys,
		"events vs bytes":  lyingEvents,
		"too many events":  encode(nil, tooManyEvents),
		"v2 body as v1":    append([]byte{1}, good[1:]...),
		"no replica":       encode(nil, &Summary{Seq: 1}),
	} {
		if _, err := decode(b, testLimits); !errors.Is(err, errMalformed) {
			t.Errorf("%s: err %v, want malformed", name, err)
		}
	}
}

// A version-1 sender (a replica not yet upgraded, during a rolling upgrade) still shares
// its bookings and keys; the version-2 fields decode empty.
func TestDecodeVersion1(t *testing.T) {
	s := sampleSummary()
	got, err := decode(encodeVersion(nil, s, 1), testLimits)
	if err != nil {
		t.Fatal(err)
	}
	want := sampleSummary()
	for i := range want.Workers {
		want.Workers[i].Writes, want.Workers[i].FirstTokens, want.Workers[i].Finished = 0, nil, nil
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("version 1:\n got %+v\nwant %+v", got, want)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(encode(nil, sampleSummary()))
	f.Add(encode(nil, &Summary{Replica: "r", Seq: 1}))
	f.Add([]byte{wireVersion, 0})
	f.Add(encodeVersion(nil, sampleSummary(), 1))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decode(b, testLimits)
		if err != nil {
			return
		}
		// Whatever decodes re-encodes to a summary that decodes the same.
		again, err := decode(encode(nil, s), testLimits)
		if err != nil || !reflect.DeepEqual(again, s) {
			t.Fatalf("re-decode: %v\n%+v\n%+v", err, again, s)
		}
		if len(s.Workers) > testLimits.MaxWorkers {
			t.Fatalf("%d workers", len(s.Workers))
		}
	})
}
