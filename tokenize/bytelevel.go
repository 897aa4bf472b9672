package tokenize

// Byte-level BPE (GPT-2, and after it Qwen, Llama 3, DeepSeek V3, gpt-oss) stores its
// vocabulary as strings over a 256-rune alphabet: every byte b maps to one printable
// rune so that the vocabulary is valid UTF-8. Source: openai/gpt-2 encoder.py
// bytes_to_unicode; tokenizers/src/pre_tokenizers/byte_level.rs.

// byteToRune maps a byte to its rune in the byte-level alphabet.
var byteToRune [256]rune

// runeToByte maps a byte-level rune back to its byte; ok is false for runes outside
// the alphabet.
var runeToByte = map[rune]byte{}

func init() {
	n := 0
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = rune(256 + n)
			n++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// decodeByteLevel turns a vocabulary string into the bytes it stands for. ok is false
// when s holds a rune outside the byte-level alphabet (such an entry can never be
// produced from text).
func decodeByteLevel(s string) ([]byte, bool) {
	out := make([]byte, 0, len(s))
	for _, r := range s {
		b, ok := runeToByte[r]
		if !ok {
			return nil, false
		}
		out = append(out, b)
	}
	return out, true
}
