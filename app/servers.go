package app

import (
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// httpServer returns an http.Server for h with the server.http_* timeouts: every HTTP
// server kvroute starts goes through here.
//
//   - ReadHeaderTimeout (server.http_read_header_timeout): headers trickled byte by byte.
//   - IdleTimeout (server.http_idle_timeout): idle keep-alive connections.
//   - admin: ReadTimeout = header + body timeout, WriteTimeout = server.http_write_timeout
//     (its answers are small and immediate).
//   - proxy: no ReadTimeout/WriteTimeout, which would cut long SSE responses (the
//     server's background read hits ReadTimeout and cancels the request); the proxy
//     handler sets a body-read deadline (server.http_body_timeout) and a per-write
//     deadline (server.http_write_timeout) itself.
func (a *App) httpServer(h http.Handler, admin bool) *http.Server {
	s := a.Config.Server
	srv := &http.Server{Handler: h, ReadHeaderTimeout: s.HTTPReadHeaderTimeout, IdleTimeout: s.HTTPIdleTimeout,
		ErrorLog: slog.NewLogLogger(a.Logger.Handler(), slog.LevelDebug)}
	if admin {
		srv.ReadTimeout = s.HTTPReadHeaderTimeout + s.HTTPBodyTimeout
		srv.WriteTimeout = s.HTTPWriteTimeout
	}
	return srv
}

// debugAuth protects /debug/* with server.admin_token ("Authorization: Bearer TOKEN",
// compared in constant time); "" leaves them open.
func (a *App) debugAuth(next http.HandlerFunc) http.HandlerFunc {
	tok := a.Config.Server.AdminToken
	if tok == "" {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(tok)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kvroute debug"`)
			explainError(w, http.StatusUnauthorized, "authentication_error", "/debug/* needs Authorization: Bearer <server.admin_token>")
			return
		}
		next(w, r)
	}
}

// extProcServerOptions are the ext_proc listener's gRPC options besides message size
// and keepalive: TLS or mTLS (server.ext_proc_tls_*) and the per-connection
// MAX_CONCURRENT_STREAMS (extproc.max_streams; the server also bounds streams across
// connections).
func (a *App) extProcServerOptions() ([]grpc.ServerOption, error) {
	s := a.Config.Server
	opts := []grpc.ServerOption{grpc.MaxConcurrentStreams(uint32(a.Config.ExtProc.MaxStreams))}
	if s.ExtProcTLSCert == "" {
		return opts, nil
	}
	cfg, err := serverTLS(s.ExtProcTLSCert, s.ExtProcTLSKey, s.ExtProcTLSClientCA)
	if err != nil {
		return nil, err
	}
	return append(opts, grpc.Creds(credentials.NewTLS(cfg))), nil
}

// serverTLS loads a server certificate and, when clientCA is set, requires client
// certificates signed by it (mTLS). TLS 1.2 minimum; HTTP/2 is negotiated by gRPC.
func serverTLS(certFile, keyFile, clientCA string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("server.ext_proc_tls_cert/key: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, fmt.Errorf("server.ext_proc_tls_client_ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("server.ext_proc_tls_client_ca: %s holds no PEM certificate", clientCA)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
