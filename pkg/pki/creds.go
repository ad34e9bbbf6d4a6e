package pki

import (
	"crypto/tls"
	"errors"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
)

// Reasons for handshakes refused before any certificate was looked at
// (see ServerCredentials). Same label set as the Reason* of verification.
const (
	// ReasonNotTLS: the client's first byte is not a TLS handshake record
	// (plaintext gRPC, HTTP, a port scanner speaking something else).
	ReasonNotTLS = "not_tls"
	// ReasonHandshake: it spoke TLS but the handshake failed before the
	// certificate check (no common version or cipher, a malformed or
	// stalled handshake).
	ReasonHandshake = "handshake"
)

// ServerCredentials returns gRPC server credentials over tc that also call
// onReject (when not nil) for handshakes that fail before tc's certificate
// check could report them: ReasonNotTLS when the client's first byte is not
// a TLS handshake record, ReasonHandshake for any other local handshake
// failure. Refusals by the certificate check are reported by tc's own hook
// (ServerConfigWithHook), never twice. Not counted: a connection closed
// before sending anything (a TCP health check) and a client that refused
// our certificate (the peer's refusal, its own to count).
func ServerCredentials(tc *tls.Config, onReject func(reason string)) credentials.TransportCredentials {
	return &countingCreds{TransportCredentials: credentials.NewTLS(tc), onReject: onReject}
}

type countingCreds struct {
	credentials.TransportCredentials
	onReject func(string)
}

func (c *countingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	fc := &firstByteConn{Conn: raw, holdClose: true}
	conn, ai, err := c.TransportCredentials.ServerHandshake(fc)
	if err != nil && c.onReject != nil {
		if r := handshakeReason(fc, err); r != "" {
			c.onReject(r)
		}
	}
	// The TLS credentials close the connection before they return a
	// failed handshake: that close was held, so that a refusal is counted
	// before the client can see the connection end.
	fc.release()
	return conn, ai, err
}

func (c *countingCreds) Clone() credentials.TransportCredentials {
	return &countingCreds{TransportCredentials: c.TransportCredentials.Clone(), onReject: c.onReject}
}

// handshakeReason classifies a failed server handshake; "" means not ours
// to count.
func handshakeReason(fc *firstByteConn, err error) string {
	var oe *net.OpError
	switch {
	case ReasonOf(err) != "":
		return "" // the certificate check refused it and counted it
	case !fc.seen:
		return "" // nothing received: closed or probed, not refused
	case fc.first != recordTypeHandshake:
		return ReasonNotTLS
	case errors.As(err, &oe) && oe.Op == "remote error":
		return "" // the client sent an alert: it refused us
	}
	return ReasonHandshake
}

// recordTypeHandshake is the content type byte that opens every TLS
// ClientHello record.
const recordTypeHandshake = 0x16

// firstByteConn remembers the first byte the client sent. It is written
// during the handshake only (by the handshaking goroutine), and read after
// it returns.
type firstByteConn struct {
	net.Conn
	seen  bool
	first byte

	mu        sync.Mutex
	holdClose bool // during the handshake: Close is deferred to release
	closed    bool // Close was called while held
}

// Close closes the connection, or while the handshake is under way notes
// the close for release.
func (c *firstByteConn) Close() error {
	c.mu.Lock()
	if c.holdClose {
		c.closed = true
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	return c.Conn.Close()
}

// release ends the hold and performs a close that was asked for meanwhile.
func (c *firstByteConn) release() {
	c.mu.Lock()
	closed := c.closed
	c.holdClose, c.closed = false, false
	c.mu.Unlock()
	if closed {
		_ = c.Conn.Close()
	}
}

func (c *firstByteConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && !c.seen {
		c.seen, c.first = true, b[0]
	}
	return n, err
}
