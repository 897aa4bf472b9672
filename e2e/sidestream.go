package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// Errors a side stream call can end with; each maps to what Envoy does (reference §5.5, §3.7).
var (
	errTimeout  = errors.New("ext_proc_error_per-message_timeout_exceeded") // → 504 (fail-closed)
	errSpurious = errors.New("spurious_message")                            // → 500
	errClosedOK = errors.New("processor closed the stream")                 // → continue unmodified
)

// sideStream is the ext_proc gRPC stream of one HTTP request (one stream per request,
// never reused: envoyproxy/envoy#34400). It is opened lazily by the first send (CC
// openStream). A receiver goroutine delivers replies in order.
type sideStream struct {
	e        *Envoy
	ctx      context.Context
	cancel   context.CancelFunc
	stream   extprocv3.ExternalProcessor_ProcessClient
	replies  chan reply
	sendMu   sync.Mutex     // one Send at a time
	mu       sync.Mutex     // guards the fields below (sender, receiver and handler goroutines)
	sent     int            // messages sent; protocol_config goes on the first only
	metadata map[string]any // dynamic metadata accepted from receiving namespaces
	done     bool           // processing complete (immediate response, error, clean close)
}

func (s *sideStream) isDone() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.done
}

func (s *sideStream) setDone() {
	s.mu.Lock()
	s.done = true
	s.mu.Unlock()
}

// meta returns the accepted metadata value at ns/key.
func (s *sideStream) meta(ns, key string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.metadata[ns].(map[string]any)
	if !ok {
		return "", false
	}
	v, ok := m[key].(string)
	return v, ok
}

type reply struct {
	r   *extprocv3.ProcessingResponse
	err error
}

func (e *Envoy) newSideStream(ctx context.Context) *sideStream {
	s := &sideStream{e: e, ctx: ctx, metadata: map[string]any{}}
	for ns, kv := range e.cfg.RequestMetadata {
		m := map[string]any{}
		for k, v := range kv {
			m[k] = v
		}
		s.metadata[ns] = m
	}
	return s
}

// setMeta sets dynamic metadata ns/key (a filter or the load balancer writing it).
func (s *sideStream) setMeta(ns, key string, v any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.metadata[ns].(map[string]any)
	if !ok {
		m = map[string]any{}
		s.metadata[ns] = m
	}
	m[key] = v
}

// metadataContext is the forwarded namespaces of the stream's dynamic metadata (CC
// addDynamicMetadata); nil when none is configured or set. Caller holds s.mu.
func (s *sideStream) metadataContextLocked() *corev3.Metadata {
	var md *corev3.Metadata
	for _, ns := range s.e.cfg.ForwardingNamespaces {
		m, ok := s.metadata[ns].(map[string]any)
		if !ok {
			continue
		}
		st, err := structpb.NewStruct(m)
		if err != nil {
			continue
		}
		if md == nil {
			md = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
		}
		md.FilterMetadata[ns] = st
	}
	return md
}

// send sends one message; Envoy never sets the gRPC end-of-stream flag on a message
// (CC sendRequest). protocol_config rides on the first message of the stream (CC
// encodeProtocolConfig) unless the configured Envoy predates it.
func (s *sideStream) send(req *extprocv3.ProcessingRequest) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return errClosedOK
	}
	if s.stream == nil {
		// The side stream outlives the downstream request's context: Envoy closes it
		// itself (close), gracefully or not, when the filter is destroyed (GC close()).
		ctx, cancel := context.WithCancel(context.WithoutCancel(s.ctx))
		st, err := s.e.client.Process(ctx)
		if err != nil {
			cancel()
			return err
		}
		s.stream, s.cancel = st, cancel
		s.replies = make(chan reply, 64)
		go func() {
			for {
				r, err := st.Recv()
				s.replies <- reply{r, err}
				if err != nil {
					return
				}
			}
		}()
	}
	if s.sent == 0 && !s.e.cfg.NoProtocolConfig {
		req.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: s.e.cfg.RequestBodyMode, ResponseBodyMode: s.e.cfg.ResponseBodyMode}
	}
	req.MetadataContext = s.metadataContextLocked()
	s.sent++
	s.e.stats.messages.Add(1)
	st := s.stream
	s.mu.Unlock()
	err := st.Send(req)
	if errors.Is(err, io.EOF) {
		// Send reports io.EOF when the stream is over; the status comes from Recv.
		err = s.finalStatus()
	}
	s.mu.Lock()
	return err
}

// finalStatus drains the receiver until the stream's end: errClosedOK for a clean
// close (OK status), else the gRPC error.
func (s *sideStream) finalStatus() error {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for {
		select {
		case rp := <-s.replies:
			if rp.err != nil {
				s.setDone()
				if errors.Is(rp.err, io.EOF) {
					return errClosedOK
				}
				return rp.err
			}
		case <-t.C:
			return io.EOF
		}
	}
}

// await waits for the next reply. timeout 0 means no per-message timer (FULL_DUPLEX:
// EP message_timeout; a long safety bound keeps tests finite). A clean close (OK) ends
// processing and the request continues unmodified (CC onGrpcClose); other gRPC errors
// fail the request (CC onGrpcError).
func (s *sideStream) await(timeout time.Duration) (*extprocv3.ProcessingResponse, error) {
	if s.isDone() {
		return nil, errClosedOK
	}
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case rp := <-s.replies:
		if rp.err != nil {
			s.setDone()
			if errors.Is(rp.err, io.EOF) {
				return nil, errClosedOK
			}
			return nil, fmt.Errorf("ext_proc_error_gRPC_error_%d{%s}", status.Code(rp.err), status.Convert(rp.err).Message())
		}
		s.acceptMetadata(rp.r)
		return rp.r, nil
	case <-t.C:
		s.e.stats.timeouts.Add(1)
		return nil, errTimeout
	case <-s.ctx.Done():
		return nil, s.ctx.Err()
	}
}

// acceptMetadata keeps dynamic metadata of the receiving namespaces only (CC
// setDynamicMetadata; EP MetadataOptions): others are dropped.
func (s *sideStream) acceptMetadata(r *extprocv3.ProcessingResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ns, v := range r.GetDynamicMetadata().GetFields() {
		for _, want := range s.e.cfg.ReceivingNamespaces {
			if ns == want {
				s.metadata[ns] = v.AsInterface()
			}
		}
	}
}

// close ends the stream the way Envoy does: half-close plus an immediate RST_STREAM
// (the server sees Canceled), or with GracefulClose a half-close that waits up to
// 1 s for the server to finish (GC close(), halfCloseAndDeleteOnRemoteClose;
// envoyproxy/envoy#38195, PR #38661).
func (s *sideStream) close() {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	s.mu.Lock()
	st := s.stream
	s.stream = nil
	s.done = true
	s.mu.Unlock()
	if st == nil {
		return
	}
	_ = st.CloseSend()
	if s.e.cfg.GracefulClose {
		t := time.NewTimer(time.Second)
		defer t.Stop()
	wait:
		for {
			select {
			case rp := <-s.replies:
				if rp.err != nil {
					break wait
				}
			case <-t.C:
				break wait
			}
		}
	}
	s.cancel()
}

// isCanceled reports a gRPC or context cancellation.
func isCanceled(err error) bool {
	return errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled
}
