package tokenize

import (
	"fmt"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/request"
)

// TestConcurrentUse: a Model is shared by every request goroutine; rendering and
// encoding concurrently (cache hits, misses and evictions racing) must give the same ids
// as one goroutine. Run with -race.
func TestConcurrentUse(t *testing.T) {
	base := loadFamily(t, "qwen3")
	m := *base
	m.cache = newSegmentCache(64<<10, 64) // small: evictions happen
	msgs := longChat(t, 24, 900)
	want := make([][]uint32, len(msgs))
	for i := 1; i < len(msgs); i++ {
		want[i] = chatIDs(t, base, &request.Request{API: request.APIChat, Messages: msgs[:i+1]})
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1 + g%3; i < len(msgs); i++ {
				text, err := m.RenderChat(&request.Request{API: request.APIChat, Messages: msgs[:i+1]})
				if err != nil {
					errs <- err
					return
				}
				if d := firstDiff(m.EncodeText(text, false), want[i]); d >= 0 {
					errs <- fmt.Errorf("goroutine %d, turn %d: ids differ at %d", g, i, d)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
