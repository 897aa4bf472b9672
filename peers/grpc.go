package peers

import (
	"context"

	"google.golang.org/grpc"
)

// The exchange is one client-streaming gRPC method: a replica dials each peer and
// streams its summaries to it; the peer answers only when the stream ends. Messages
// are summaries in this package's encoding (wire.go), carried by a codec that passes
// bytes through, so no generated code is needed.
const (
	serviceName = "kvroute.peers.v1.Peers"
	methodName  = "/" + serviceName + "/Exchange"
)

// frame is one gRPC message: a summary's encoding.
type frame struct{ b []byte }

// codec passes frames through unchanged (gRPC bounds their size before this runs:
// grpc.MaxRecvMsgSize).
type codec struct{}

func (codec) Marshal(v any) ([]byte, error) { return v.(*frame).b, nil }

func (codec) Unmarshal(data []byte, v any) error {
	v.(*frame).b = append(v.(*frame).b[:0], data...)
	return nil
}

func (codec) Name() string { return "kvroute-peers" }

var streamDesc = grpc.StreamDesc{StreamName: "Exchange", ClientStreams: true}

// exchangeServer is implemented by *Manager.
type exchangeServer interface {
	exchange(stream grpc.ServerStream) error
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*exchangeServer)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Exchange",
		ClientStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			return srv.(exchangeServer).exchange(stream)
		},
	}},
	Metadata: "kvroute/peers",
}

func openStream(ctx context.Context, cc *grpc.ClientConn) (grpc.ClientStream, error) {
	return cc.NewStream(ctx, &streamDesc, methodName, grpc.ForceCodec(codec{}))
}
