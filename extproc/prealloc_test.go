package extproc

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/config"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/workers"
)

// A client's declared content-length reserves at most 256 KiB up front in the
// accumulating modes; a small declared length is presized exactly; the buffer still
// grows past the cap with the bytes that arrive.
func TestStartBodyCapsPrealloc(t *testing.T) {
	s := New(Options{Router: router.New(router.Options{Registry: workers.NewRegistry()}), Config: config.Default().ExtProc})
	max := s.opt.Config.MaxBodyBytes
	for _, c := range []struct {
		name           string
		mode           mode
		withoutWaiting bool
		declared, want int
	}{
		{"full duplex, declared just under the limit", modeFullDuplex, false, max - 1, 256 << 10},
		{"streamed without waiting, declared just under the limit", modeStreamed, true, max - 1, 256 << 10},
		{"full duplex, small body", modeFullDuplex, false, 1000, 1000},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := newStream(s, context.Background(), nil)
			st.reqMode, st.withoutWaiting, st.contentLength = c.mode, c.withoutWaiting, c.declared
			if err := st.startBody(); err != nil {
				t.Fatal(err)
			}
			if cap(st.body) != c.want || len(st.body) != 0 {
				t.Fatalf("body len %d cap %d, want 0 and %d", len(st.body), cap(st.body), c.want)
			}
		})
	}
}
