package router

import "unicode/utf8"

// maxEchoedModel bounds the model name echoed in a 404 (bytes): a client-chosen string
// of any length must not be reflected whole.
const maxEchoedModel = 128

// echoModel returns name cut to at most maxEchoedModel bytes on a UTF-8 boundary,
// with "…" appended when cut.
func echoModel(name string) string {
	if len(name) <= maxEchoedModel {
		return name
	}
	cut := maxEchoedModel
	for cut > 0 && !utf8.RuneStart(name[cut]) {
		cut--
	}
	return name[:cut] + "…"
}
