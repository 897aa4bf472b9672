// Package jsonvalue is an order-preserving JSON value and its parser: a JSON text read
// the way Python's json.loads reads it for vLLM, which is what a chat template sees.
// Objects keep their members in first-occurrence order and a repeated key takes its
// last value; numbers keep their literal text (int vs float, digits beyond float64);
// strings must be valid UTF-8. Parsing bounds nesting (MaxDepth) and stays linear in the
// size of hostile input (repeated keys, deep nesting); an array of plain uint32 integers
// (a token-id prompt) is stored packed, 4 bytes per element. Package request parses
// request bodies into Values; tokenize renders them through chat templates; scoring
// reads their text.
//
// Files: value.go (Value, Kind, Member, constructors, AppendJSON), parse.go (ParseValue,
// SyntaxError), packed.go (arrays of uint32 integers stored packed: Uint32s),
// sniff.go (SniffString: one member of a possibly truncated object).
package jsonvalue
