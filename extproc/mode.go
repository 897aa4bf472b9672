package extproc

import (
	"strings"

	procmodev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
)

// mode is a body send mode (PM ProcessingMode.BodySendMode).
type mode = procmodev3.ProcessingMode_BodySendMode

const (
	modeNone            = procmodev3.ProcessingMode_NONE
	modeStreamed        = procmodev3.ProcessingMode_STREAMED
	modeBuffered        = procmodev3.ProcessingMode_BUFFERED
	modeBufferedPartial = procmodev3.ProcessingMode_BUFFERED_PARTIAL
	modeFullDuplex      = procmodev3.ProcessingMode_FULL_DUPLEX_STREAMED
	modeGRPC            = procmodev3.ProcessingMode_GRPC
)

// parseMode maps a config value ("BUFFERED") to a mode; unknown values give def.
func parseMode(s string, def mode) mode {
	if v, ok := procmodev3.ProcessingMode_BodySendMode_value[strings.ToUpper(s)]; ok {
		return mode(v)
	}
	return def
}

// modeLabel is the metrics label of a mode: "full_duplex_streamed", "buffered", …;
// a value outside the enum (protocol_config is the client's input) is "unknown", so
// the label set stays bounded.
func modeLabel(m mode) string {
	if _, ok := procmodev3.ProcessingMode_BodySendMode_name[int32(m)]; !ok {
		return "unknown"
	}
	return strings.ToLower(m.String())
}

// duplex reports whether body replies in mode m must carry streamed_response (PS
// handleStreamedBodyCallback: required in FULL_DUPLEX_STREAMED, and GRPC, which is the
// de-framed variant of it; a protocol error in every other mode).
func duplex(m mode) bool { return m == modeFullDuplex || m == modeGRPC }
