package classify

import (
	"encoding/base64"
	"encoding/json"
	"regexp"
	"sort"
	"strings"
)

// Span is one recognized pattern: its type and the byte range text[Start:End].
type Span struct {
	Type  string `json:"type"`
	Start int    `json:"start"`
	End   int    `json:"end"`
}

// PII types reported by FindPII.
const (
	PIIEmail      = "email"
	PIIPhone      = "phone"
	PIICreditCard = "credit_card"
	PIIIBAN       = "iban"
	PIIUSSSN      = "us_ssn"
	PIIIPv4       = "ipv4"
	PIIAWSKey     = "aws_access_key"
	PIIJWT        = "jwt"
	PIIPrivateKey = "private_key"
)

// PIITypes lists every type FindPII reports, in a fixed order.
var PIITypes = []string{PIIEmail, PIIPhone, PIICreditCard, PIIIBAN, PIIUSSSN, PIIIPv4, PIIAWSKey, PIIJWT, PIIPrivateKey}

// A recognizer is a candidate expression (RE2: linear in the text) and a validator that
// sees the candidate and the bytes around it; only validated candidates are spans.
type recognizer struct {
	typ   string
	re    *regexp.Regexp
	valid func(text string, s, e int) bool
	// trim, when set, returns where the span really ends (≤ e) for a candidate the
	// expression may have run past.
	trim func(text string, s, e int) int
	// need, when set, is a substring every match contains: a text without it skips the
	// expression (a byte search is ~100× cheaper than a regexp scan).
	need string
}

var recognizers = []recognizer{
	{PIIPrivateKey, regexp.MustCompile(`-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----(?:[A-Za-z0-9+/=:,\-\s]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----)?`), func(string, int, int) bool { return true }, nil, "PRIVATE KEY-----"},
	{PIIJWT, regexp.MustCompile(`eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{8,}`), validJWT, nil, "eyJ"},
	{PIIAWSKey, regexp.MustCompile(`(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|AROA|APKA|ASCA)[A-Z2-7]{16}`), func(t string, s, e int) bool { return boundary(t, s, e, isAlnum) }, nil, ""},
	{PIIEmail, regexp.MustCompile(`[A-Za-z0-9][A-Za-z0-9._%+\-]{0,63}@[A-Za-z0-9](?:[A-Za-z0-9\-]{0,62}\.)+[A-Za-z]{2,24}`), validEmail, nil, "@"},
	{PIIIBAN, regexp.MustCompile(`[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]){11,30}`), validIBAN, ibanEnd, ""},
	{PIICreditCard, regexp.MustCompile(`[0-9](?:[ \-]?[0-9]){12,18}`), validCard, nil, ""},
	{PIIUSSSN, regexp.MustCompile(`[0-9]{3}-[0-9]{2}-[0-9]{4}`), validSSN, nil, ""},
	{PIIPhone, regexp.MustCompile(`\+[0-9]{1,3}(?:[ .\-]?[0-9]{1,8}){1,6}|(?:\([0-9]{2,4}\)|[0-9]{2,4})(?:[ .\-][0-9]{2,4}){1,4}`), validPhone, nil, ""},
	{PIIIPv4, regexp.MustCompile(`[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}`), validIPv4, nil, ""},
}

// FindPII appends to dst the PII and secret spans of text, sorted by start, none
// overlapping another: recognizers run in a fixed order (private keys and tokens first,
// then the checksummed numbers, then phones and addresses) and a later candidate that
// overlaps an accepted span is dropped, so a card number is never also a phone.
func FindPII(dst []Span, text string) []Span {
	base := len(dst)
	for _, r := range recognizers {
		if r.need != "" && !strings.Contains(text, r.need) {
			continue
		}
		for _, loc := range r.re.FindAllStringIndex(text, -1) {
			s, e := loc[0], loc[1]
			if r.trim != nil {
				e = r.trim(text, s, e)
			}
			if overlaps(dst[base:], s, e) || !r.valid(text, s, e) {
				continue
			}
			dst = append(dst, Span{Type: r.typ, Start: s, End: e})
		}
	}
	found := dst[base:]
	sort.Slice(found, func(i, j int) bool { return found[i].Start < found[j].Start })
	return dst
}

func overlaps(spans []Span, s, e int) bool {
	for _, sp := range spans {
		if s < sp.End && sp.Start < e {
			return true
		}
	}
	return false
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isAlnum(c byte) bool {
	return isDigit(c) || (c|0x20 >= 'a' && c|0x20 <= 'z')
}

// boundary reports whether text[s:e] is not glued to a neighbour byte for which in is
// true.
func boundary(text string, s, e int, in func(byte) bool) bool {
	return (s == 0 || !in(text[s-1])) && (e == len(text) || !in(text[e]))
}

// numBoundary rejects a number glued to more digits, or to a digit group that continues
// it ("1.2.3.4.5", "12-34-56-78", "4111 1111 1111 1111 1").
func numBoundary(text string, s, e int) bool {
	if !boundary(text, s, e, isAlnum) {
		return false
	}
	if s >= 2 && strings.IndexByte(".-/_", text[s-1]) >= 0 && isAlnum(text[s-2]) {
		return false
	}
	if e+1 < len(text) && strings.IndexByte(".-/_", text[e]) >= 0 && isAlnum(text[e+1]) {
		return false
	}
	return true
}

func digitsOf(s string) []byte {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if isDigit(s[i]) {
			out = append(out, s[i]-'0')
		}
	}
	return out
}

// luhn is the ISO/IEC 7812-1 Annex B check digit test.
func luhn(d []byte) bool {
	sum := 0
	for i := len(d) - 1; i >= 0; i-- {
		v := int(d[i])
		if (len(d)-1-i)%2 == 1 {
			v *= 2
			if v > 9 {
				v -= 9
			}
		}
		sum += v
	}
	return sum%10 == 0
}

// validCard accepts 13-19 digits, grouped uniformly by one separator kind or not at all,
// with an issuer prefix of a major scheme (ISO/IEC 7812 IIN ranges: Visa 4, Mastercard
// 51-55 and 2221-2720, Amex 34/37, Discover 6011/65/644-649, JCB 3528-3589, Diners 36/38/300-305,
// UnionPay 62) and a valid Luhn check digit.
func validCard(text string, s, e int) bool {
	if !numBoundary(text, s, e) {
		return false
	}
	c := text[s:e]
	if strings.Contains(c, " ") && strings.Contains(c, "-") {
		return false
	}
	d := digitsOf(c)
	if len(d) < 13 || len(d) > 19 || !luhn(d) {
		return false
	}
	p := func(n int) int {
		v := 0
		for _, x := range d[:n] {
			v = v*10 + int(x)
		}
		return v
	}
	switch {
	case d[0] == 4:
		return len(d) == 13 || len(d) == 16 || len(d) == 19
	case p(2) >= 51 && p(2) <= 55, p(4) >= 2221 && p(4) <= 2720:
		return len(d) == 16
	case p(2) == 34 || p(2) == 37:
		return len(d) == 15
	case p(4) == 6011 || p(2) == 65 || (p(3) >= 644 && p(3) <= 649), p(2) == 62:
		return len(d) >= 16
	case p(4) >= 3528 && p(4) <= 3589:
		return len(d) >= 16
	case p(2) == 36 || p(2) == 38 || (p(3) >= 300 && p(3) <= 305):
		return len(d) >= 14
	}
	return false
}

// validSSN follows the SSA's rules for numbers never issued: area 000, 666 and 900-999,
// group 00 and serial 0000 (SSA, "Social Security Number Randomization", 2011).
func validSSN(text string, s, e int) bool {
	if !numBoundary(text, s, e) {
		return false
	}
	c := text[s:e]
	area, group, serial := c[0:3], c[4:6], c[7:11]
	return area != "000" && area != "666" && area[0] != '9' && group != "00" && serial != "0000"
}

// validIPv4 accepts a dotted quad of 0-255 without leading zeros, not inside a longer
// dotted run (a version string) — RFC 3986's dec-octet.
func validIPv4(text string, s, e int) bool {
	if !numBoundary(text, s, e) {
		return false
	}
	for _, o := range strings.Split(text[s:e], ".") {
		if len(o) > 1 && o[0] == '0' {
			return false
		}
		v := 0
		for i := 0; i < len(o); i++ {
			v = v*10 + int(o[i]-'0')
		}
		if v > 255 {
			return false
		}
	}
	return true
}

func validEmail(text string, s, e int) bool {
	if s > 0 && (isAlnum(text[s-1]) || strings.IndexByte("._%+-@", text[s-1]) >= 0) {
		return false
	}
	if e < len(text) && (isAlnum(text[e]) || text[e] == '@') {
		return false
	}
	c := text[s:e]
	at := strings.IndexByte(c, '@')
	local := c[:at]
	return !strings.Contains(local, "..") && !strings.HasSuffix(local, ".")
}

// validPhone accepts an international number (+CC, 8-15 digits: ITU-T E.164) or a
// NANP number (10 digits, or 11 with a leading 1; area and exchange codes start 2-9),
// written with separators or parentheses: a bare run of digits is an order number, and
// a date's "2024-01-15" or a time's "12.30" is not a phone.
func validPhone(text string, s, e int) bool {
	if !numBoundary(text, s, e) || (s > 0 && text[s-1] == '+') {
		return false
	}
	c := text[s:e]
	d := digitsOf(c)
	if c[0] == '+' {
		return len(d) >= 8 && len(d) <= 15
	}
	if len(d) == 11 && d[0] == 1 {
		d = d[1:]
	}
	if len(d) != 10 || d[0] < 2 || d[3] < 2 {
		return false
	}
	// NANP groups: 3-3-4, (3) 3-4 or 1-3-3-4.
	groups := strings.FieldsFunc(c, func(r rune) bool { return r == ' ' || r == '.' || r == '-' || r == '(' || r == ')' })
	if len(groups) > 0 && groups[0] == "1" {
		groups = groups[1:]
	}
	if len(groups) != 3 || len(groups[0]) != 3 || len(groups[1]) != 3 || len(groups[2]) != 4 {
		return false
	}
	seps := strings.Map(func(r rune) rune {
		if r == ' ' || r == '.' || r == '-' {
			return r
		}
		return -1
	}, c)
	// one separator kind between groups ("555-123-4567", "555.123.4567"), or "(555) 123-4567".
	return strings.Count(seps, "-") == len(seps) || strings.Count(seps, ".") == len(seps) ||
		strings.Count(seps, " ") == len(seps) || (strings.HasPrefix(c, "(") || strings.Contains(c, ") "))
}

// ibanLength is each country's IBAN length (SWIFT IBAN Registry, release 98, 2024).
var ibanLength = map[string]int{
	"AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29,
	"CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24,
	"FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21,
	"HU": 28, "IE": 22, "IL": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LI": 21,
	"LT": 20, "LU": 20, "LV": 21, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30,
	"NL": 18, "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24,
	"SE": 24, "SI": 19, "SK": 24, "SM": 27, "TN": 24, "TR": 26, "UA": 29, "VG": 24, "XK": 20,
}

// ibanEnd cuts an IBAN candidate, which may have run into a following upper-case word,
// to its country's length (spaces not counted).
func ibanEnd(text string, s, e int) int {
	n, ok := ibanLength[text[s:s+2]]
	if !ok {
		return e
	}
	got := 0
	for i := s; i < e; i++ {
		if text[i] != ' ' {
			got++
		}
		if got == n {
			return i + 1
		}
	}
	return e
}

// validIBAN checks the country's length and the ISO 13616-1 mod-97 check (letters as
// 10..35, the first four characters moved to the end, the number mod 97 is 1).
func validIBAN(text string, s, e int) bool {
	if !boundary(text, s, e, isAlnum) {
		return false
	}
	n, ok := ibanLength[text[s:s+2]]
	if !ok {
		return false
	}
	var chars []byte
	for i := s; i < e; i++ {
		if text[i] != ' ' {
			chars = append(chars, text[i])
		}
	}
	if len(chars) != n {
		return false
	}
	rem := 0
	for _, c := range append(chars[4:], chars[:4]...) {
		if isDigit(c) {
			rem = (rem*10 + int(c-'0')) % 97
		} else {
			rem = (rem*100 + int(c-'A'+10)) % 97
		}
	}
	return rem == 1
}

// validJWT accepts a compact JWS (RFC 7515 §7.1) whose header decodes to a JSON object
// with an "alg" member.
func validJWT(text string, s, e int) bool {
	if !boundary(text, s, e, func(c byte) bool { return isAlnum(c) || c == '_' || c == '-' || c == '.' }) {
		return false
	}
	hdr := text[s : s+strings.IndexByte(text[s:e], '.')]
	raw, err := base64.RawURLEncoding.DecodeString(hdr)
	if err != nil {
		return false
	}
	var h map[string]any
	if json.Unmarshal(raw, &h) != nil {
		return false
	}
	_, ok := h["alg"]
	return ok
}
