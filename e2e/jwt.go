package e2e

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"
)

// JWTAuthn imitates Envoy's jwt_authn HTTP filter placed before ext_proc (JA:
// envoy/extensions/filters/http/jwt_authn/v3/config.proto and the filter's doc,
// configuration/http/http_filters/jwt_authn_filter): one provider, the token from the
// default location (Authorization: Bearer), a local JWKS, and one rule that applies to
// every request. A verified token's payload is written to dynamic metadata
// envoy.filters.http.jwt_authn/<PayloadInMetadata> as a Struct, where ext_proc's
// forwarding_namespaces picks it up; a missing or failing token is answered 401 by
// Envoy itself ("Jwt is missing" / "Jwt verification fails", with
// www-authenticate: Bearer …), before ext_proc sees anything.
//
// Simplifications: RS256 only (Envoy also takes ES*, PS*, HS*, EdDSA); no
// from_params/from_cookies, no clock_skew_seconds (Envoy's default is 60 s), no
// claim_to_headers or forward_payload_header.
type JWTAuthn struct {
	Issuer            string   // provider issuer; the token's iss must equal it
	Audiences         []string // the token's aud must contain one of them; empty: any
	JWKS              []byte   // local_jwks: a JWKS document (RSA keys: kty, kid, n, e)
	PayloadInMetadata string   // payload_in_metadata; "" writes nothing
	Forward           bool     // forward: keep the token on the request (default false: removed)
	RequireExpiration bool     // require_expiration: a token without exp fails
	// AllowMissing is the requirement allow_missing: a request without a token passes
	// unverified (no metadata); a bad token still fails.
	AllowMissing bool
	Now          func() time.Time // nil: time.Now
}

// JWTNamespace is the dynamic metadata namespace jwt_authn writes.
const JWTNamespace = "envoy.filters.http.jwt_authn"

var (
	errJWTMissing = errors.New("Jwt is missing")
	errJWTInvalid = errors.New("Jwt verification fails")
)

// verify runs the filter on the request headers: the payload of a verified token, nil
// for a missing token under AllowMissing, or the local reply Envoy sends.
func (j *JWTAuthn) verify(h headerList) (map[string]any, *localReply) {
	tok, ok := bearer(h.get("authorization"))
	if !ok {
		if j.AllowMissing {
			return nil, nil
		}
		return nil, jwtReply(errJWTMissing)
	}
	payload, err := j.check(tok)
	if err != nil {
		return nil, jwtReply(errJWTInvalid)
	}
	return payload, nil
}

func bearer(v string) (string, bool) {
	if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		return strings.TrimSpace(v[7:]), true
	}
	return "", false
}

func jwtReply(err error) *localReply {
	return &localReply{status: 401, body: err.Error(),
		headers: headerList{{"www-authenticate", `Bearer realm="kvroute", error="invalid_token"`}},
		details: "jwt_authn_access_denied{" + strings.ReplaceAll(err.Error(), " ", "_") + "}"}
}

// check verifies an RS256 compact JWS against the JWKS and the provider's issuer,
// audiences and time rules, and returns its payload.
func (j *JWTAuthn) check(tok string) (map[string]any, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return nil, errors.New("not a compact JWS")
	}
	var hdr struct {
		Alg string `json:"alg"`
		Kid string `json:"kid"`
	}
	if err := decodeSegment(parts[0], &hdr); err != nil {
		return nil, err
	}
	if hdr.Alg != "RS256" {
		return nil, fmt.Errorf("alg %q not imitated", hdr.Alg)
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return nil, err
	}
	keys, err := parseJWKS(j.JWKS)
	if err != nil {
		return nil, err
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	verified := false
	for kid, k := range keys {
		if hdr.Kid != "" && kid != hdr.Kid {
			continue
		}
		if rsa.VerifyPKCS1v15(k, crypto.SHA256, digest[:], sig) == nil {
			verified = true
			break
		}
	}
	if !verified {
		return nil, errors.New("signature")
	}
	var payload map[string]any
	if err := decodeSegment(parts[1], &payload); err != nil {
		return nil, err
	}
	if iss, _ := payload["iss"].(string); j.Issuer != "" && iss != j.Issuer {
		return nil, errors.New("issuer")
	}
	if len(j.Audiences) > 0 && !audienceOK(payload["aud"], j.Audiences) {
		return nil, errors.New("audience")
	}
	now := time.Now
	if j.Now != nil {
		now = j.Now
	}
	t := float64(now().Unix())
	exp, hasExp := payload["exp"].(float64)
	switch {
	case !hasExp && j.RequireExpiration:
		return nil, errors.New("no exp")
	case hasExp && t >= exp:
		return nil, errors.New("expired")
	}
	if nbf, ok := payload["nbf"].(float64); ok && t < nbf {
		return nil, errors.New("not yet valid")
	}
	return payload, nil
}

func decodeSegment(s string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func audienceOK(aud any, want []string) bool {
	switch a := aud.(type) {
	case string:
		return slices.Contains(want, a)
	case []any:
		for _, x := range a {
			if s, ok := x.(string); ok && slices.Contains(want, s) {
				return true
			}
		}
	}
	return false
}

// parseJWKS returns the RSA keys of a JWKS document by kid.
func parseJWKS(doc []byte) (map[string]*rsa.PublicKey, error) {
	var set struct {
		Keys []struct {
			Kty, Kid, N, E string
		} `json:"keys"`
	}
	if err := json.Unmarshal(doc, &set); err != nil {
		return nil, fmt.Errorf("jwks: %w", err)
	}
	out := map[string]*rsa.PublicKey{}
	for _, k := range set.Keys {
		if k.Kty != "RSA" {
			continue
		}
		n, err1 := base64.RawURLEncoding.DecodeString(k.N)
		e, err2 := base64.RawURLEncoding.DecodeString(k.E)
		if err1 != nil || err2 != nil || len(e) == 0 || len(e) > 4 {
			return nil, errors.New("jwks: bad RSA key")
		}
		out[k.Kid] = &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
	}
	return out, nil
}
