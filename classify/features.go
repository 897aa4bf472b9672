package classify

// Features turns text into hashed feature indices, the "hashing trick" of
// Weinberger et al., "Feature Hashing for Large Scale Multitask Learning" (ICML 2009),
// with the word n-grams and character n-grams of fastText (Joulin et al., "Bag of Tricks
// for Efficient Text Classification", EACL 2017; Bojanowski et al., "Enriching Word
// Vectors with Subword Information", TACL 2017).
//
// Text is split into words: runs of ASCII letters and digits and of non-ASCII bytes
// (UTF-8 continuation bytes stay inside their word). ASCII letters are lowered and every
// digit becomes '0', so "3.14" and "2.71" share their features. Each word yields its own
// feature, the bigram with the word before it (when WordNgrams ≥ 2), and the character
// n-grams of "<word>" for CharMin ≤ n ≤ CharMax. Only the first WindowBytes bytes of the
// text are read: a 220 KB conversation costs what its window costs.
type Features struct {
	// Bits is log2 of the hashed feature space (each index < 1<<Bits); 10..24.
	Bits uint8 `json:"bits"`
	// WordNgrams is 1 (words) or 2 (words and adjacent word pairs).
	WordNgrams int `json:"word_ngrams"`
	// CharMin and CharMax bound the character n-gram lengths; CharMax 0 turns them off.
	CharMin int `json:"char_min"`
	CharMax int `json:"char_max"`
	// WindowBytes is how much of a text is read (from its start); 0 means all of it.
	WindowBytes int `json:"window_bytes"`
}

// DefaultFeatures is what `kvroute classify train` uses unless told otherwise.
func DefaultFeatures() Features {
	return Features{Bits: 20, WordNgrams: 2, CharMin: 4, CharMax: 5, WindowBytes: 4096}
}

const (
	fnvOffset = 2166136261
	fnvPrime  = 16777619
	// seeds separate the three kinds of feature so a word never collides by design with
	// the character n-gram of the same bytes.
	seedWord   = 0x9e3779b9
	seedBigram = 0x85ebca6b
	seedChar   = 0xc2b2ae35
)

func mix(h uint32) uint32 {
	// murmur3's fmix32 finalizer: spreads FNV's low bits over the whole word.
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// fold maps a byte to its feature byte: lowered ASCII letter, '0' for a digit, the byte
// itself for non-ASCII, 0 for a separator.
var fold = func() (t [256]byte) {
	for c := 0; c < 256; c++ {
		switch {
		case c >= 'a' && c <= 'z':
			t[c] = byte(c)
		case c >= 'A' && c <= 'Z':
			t[c] = byte(c) + 'a' - 'A'
		case c >= '0' && c <= '9':
			t[c] = '0'
		case c >= 0x80:
			t[c] = byte(c)
		}
	}
	return t
}()

// Append appends text's feature indices to dst and returns it. It allocates only when
// dst must grow; the order of indices is deterministic.
func (f *Features) Append(dst []uint32, text string) []uint32 {
	if f.WindowBytes > 0 && len(text) > f.WindowBytes {
		text = text[:f.WindowBytes]
	}
	mask := uint32(1)<<f.Bits - 1
	var prev uint32
	havePrev := false
	var word [64]byte
	i := 0
	for i < len(text) {
		if fold[text[i]] == 0 {
			i++
			continue
		}
		// one word: text[i:j], folded into word[1:n+1] (truncated at 62 bytes).
		n := 0
		h := uint32(fnvOffset)
		for ; i < len(text) && fold[text[i]] != 0; i++ {
			c := fold[text[i]]
			h = (h ^ uint32(c)) * fnvPrime
			if n < len(word)-2 {
				word[n+1] = c
				n++
			}
		}
		wh := mix(h ^ seedWord)
		dst = append(dst, wh&mask)
		if f.WordNgrams >= 2 && havePrev {
			dst = append(dst, mix(prev*fnvPrime^wh^seedBigram)&mask)
		}
		prev, havePrev = wh, true
		if f.CharMax > 0 && n >= 2 {
			word[0], word[n+1] = '<', '>'
			w := word[:n+2]
			for s := 0; s+f.CharMin <= len(w); s++ {
				ch := uint32(fnvOffset) ^ seedChar
				for k := s; k < len(w) && k-s < f.CharMax; k++ {
					ch = (ch ^ uint32(w[k])) * fnvPrime
					if k-s+1 >= f.CharMin {
						dst = append(dst, mix(ch)&mask)
					}
				}
			}
		}
	}
	return dst
}
