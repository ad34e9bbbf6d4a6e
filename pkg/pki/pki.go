// Package pki owns Cutover's mutual TLS: the tls.Config of every server and
// client in the control path (coordctl → coordinator → agent), the role each
// certificate carries, and a small issuer for lab PKIs.
//
// # Identity: a role in a URI SAN
//
// Every leaf certificate carries exactly one URI SAN of the form
// cutover://role/<role> (RoleAgent, RoleCoordinator, RoleAdmin). A URI SAN
// was chosen over the Subject OU because it is structured (parsed by
// crypto/x509 into cert.URIs, no free-text conventions), cannot be confused
// with an organisation's own OU naming when an operator issues certificates
// from an existing enterprise CA, and follows the SPIFFE pattern that
// service meshes and cert-manager already know how to issue
// (cert-manager: spec.uris). A certificate with no role URI, or with more
// than one, is rejected.
//
// # Verification
//
// Both sides verify the peer themselves in tls.Config.VerifyConnection, with
// the same code: the chain must lead to the configured CA only (never the
// system roots), the leaf must carry the right ExtKeyUsage (serverAuth when
// the peer is a server, clientAuth when it is a client), be within its
// validity window, and carry an allowed role. Hostnames and IP SANs are
// NOT verified: agents are dialled by pod IP in labs and by host IP in
// clusters, and a node's IP can change (re-IP, multiple interfaces, NAT in
// front of a lab) while its identity does not. Authorisation in Cutover is
// "a certificate from our CA with role X", not "the certificate for this
// address"; issuing from a CA dedicated to Cutover (as Issue does) is what
// makes that sound. Issued certificates still carry IP and DNS SANs so
// that generic tools (curl, openssl s_client, grpcurl) work against them.
//
// Doing the check in VerifyConnection (rather than letting crypto/tls verify
// client certificates itself) is what lets every rejection be reported with
// a reason to the onReject hook, so servers can count rejected handshakes
// (Reason* constants, a bounded set usable as a metric label). Handshakes
// that fail before any certificate is seen (plaintext to the TLS port, no
// common TLS version) never reach VerifyConnection: gRPC servers count
// them through ServerCredentials, which watches the handshake itself.
//
// # Reload
//
// Certificates, keys and the CA are re-read from disk when their content
// changes (Reloader, reload.go): every config hands out the key pair
// through GetCertificate / GetClientCertificate and verifies peers against
// the CA pool current at the handshake. cert-manager renews certificates
// with new keys before they expire; a process never has to restart for it.
//
// This package must not dial, listen or log: it builds configs, gRPC
// credentials and files.
package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Roles carried in certificates.
const (
	RoleAgent       = "agent"
	RoleCoordinator = "coordinator"
	RoleAdmin       = "admin" // coordctl
)

// roleURIPrefix is the scheme+host+path prefix of the role URI SAN.
const roleURIPrefix = "cutover://role/"

// RoleURI returns the URI SAN that marks a certificate with role.
func RoleURI(role string) *url.URL {
	return &url.URL{Scheme: "cutover", Host: "role", Path: "/" + role}
}

// Rejection reasons passed to the onReject hook. A bounded set: safe as a
// Prometheus label value.
const (
	ReasonNoCertificate  = "no_certificate"    // peer presented no certificate
	ReasonUnknownCA      = "unknown_authority" // chain does not lead to the configured CA
	ReasonExpired        = "expired"           // outside its validity window (expired or not yet valid)
	ReasonWrongUsage     = "wrong_usage"       // ExtKeyUsage does not allow this direction
	ReasonNoRole         = "no_role"           // no (or more than one) cutover role URI SAN
	ReasonWrongRole      = "wrong_role"        // role not among the allowed ones
	ReasonBadCertificate = "bad_certificate"   // anything else in verification
)

// Files names the PEM files of one identity.
type Files struct {
	CA   string // CA certificate(s) that peers must chain to
	Cert string // this process's certificate (chain allowed)
	Key  string // this process's private key
}

// AddFlags binds f to --tls-ca, --tls-cert and --tls-key: one spelling and
// one place for every binary (agent, coordinator, coordctl). peer names who
// must chain to the CA, self whose certificate and key these are, for the
// help text.
func (f *Files) AddFlags(fs *pflag.FlagSet, peer, self string) {
	fs.StringVar(&f.CA, "tls-ca", f.CA, "CA certificate (PEM) that "+peer+" must chain to")
	fs.StringVar(&f.Cert, "tls-cert", f.Cert, self+"'s certificate (PEM)")
	fs.StringVar(&f.Key, "tls-key", f.Key, self+"'s private key (PEM)")
}

// Validate checks that each file is named and readable. Error messages use
// the flag names (tls-ca, tls-cert, tls-key) because that is what a user
// sets.
func (f Files) Validate() error {
	var errs []error
	for _, x := range []struct{ flag, path string }{{"tls-ca", f.CA}, {"tls-cert", f.Cert}, {"tls-key", f.Key}} {
		if x.path == "" {
			errs = append(errs, fmt.Errorf("--%s: no file given: set it to a PEM file (coordctl certs creates a lab set)", x.flag))
			continue
		}
		fh, err := os.Open(x.path)
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s %q: cannot read: %w", x.flag, x.path, err))
			continue
		}
		_ = fh.Close()
	}
	return errors.Join(errs...)
}

// ServerConfig returns the config of a server that presents f.Cert and
// requires every client to present a certificate chained to f.CA with
// clientAuth usage and one of allowedPeerRoles.
func ServerConfig(f Files, allowedPeerRoles ...string) (*tls.Config, error) {
	return ServerConfigWithHook(f, nil, allowedPeerRoles...)
}

// ServerConfigWithHook is ServerConfig that also calls onReject (when not
// nil) with one of the Reason* constants for every rejected client, so the
// server can count rejections by reason. onReject must be cheap and safe
// for concurrent use: it runs inside handshakes.
func ServerConfigWithHook(f Files, onReject func(reason string), allowedPeerRoles ...string) (*tls.Config, error) {
	if err := checkRoles(allowedPeerRoles); err != nil {
		return nil, err
	}
	r, err := NewReloader(f, ReloadOptions{})
	if err != nil {
		return nil, err
	}
	return ReloadingServerConfig(r, onReject, allowedPeerRoles...)
}

// ReloadingServerConfig is ServerConfigWithHook over r: every handshake
// presents r's current certificate and verifies the client against r's
// current CA pool.
func ReloadingServerConfig(r *Reloader, onReject func(reason string), allowedPeerRoles ...string) (*tls.Config, error) {
	if err := checkRoles(allowedPeerRoles); err != nil {
		return nil, err
	}
	v := verifier{pool: r.pool, usage: x509.ExtKeyUsageClientAuth, roles: allowedPeerRoles, onReject: onReject, peer: "client"}
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: r.getCertificate,
		// RequestClientCert, not RequireAndVerifyClientCert: the missing
		// certificate and the chain are checked in VerifyConnection so that
		// every rejection goes through one place and gets a reason.
		ClientAuth:       tls.RequestClientCert,
		VerifyConnection: v.verify,
	}, nil
}

// ClientConfig returns the config of a client that presents f.Cert and
// requires the server to chain to f.CA with serverAuth usage and role
// wantServerRole.
func ClientConfig(f Files, wantServerRole string) (*tls.Config, error) {
	return ClientConfigWithHook(f, nil, wantServerRole)
}

// ClientConfigWithHook is ClientConfig that also calls onReject (when not
// nil) with a Reason* constant when the server is rejected.
func ClientConfigWithHook(f Files, onReject func(reason string), wantServerRole string) (*tls.Config, error) {
	if err := checkRoles([]string{wantServerRole}); err != nil {
		return nil, err
	}
	r, err := NewReloader(f, ReloadOptions{})
	if err != nil {
		return nil, err
	}
	return ReloadingClientConfig(r, onReject, wantServerRole)
}

// ReloadingClientConfig is ClientConfigWithHook over r: every handshake
// presents r's current certificate and verifies the server against r's
// current CA pool.
func ReloadingClientConfig(r *Reloader, onReject func(reason string), wantServerRole string) (*tls.Config, error) {
	if err := checkRoles([]string{wantServerRole}); err != nil {
		return nil, err
	}
	v := verifier{pool: r.pool, usage: x509.ExtKeyUsageServerAuth, roles: []string{wantServerRole}, onReject: onReject, peer: "server"}
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		GetClientCertificate: r.getClientCertificate,
		// InsecureSkipVerify only turns off crypto/tls's own verification,
		// which would also check the hostname against the dialled address
		// (see the package doc for why we do not). VerifyConnection below
		// does the full chain, usage, expiry and role check instead; this is
		// the pattern crypto/tls documents for custom verification.
		InsecureSkipVerify: true, //nolint:gosec // verified in VerifyConnection
		VerifyConnection:   v.verify,
	}, nil
}

func checkRoles(roles []string) error {
	if len(roles) == 0 {
		return errors.New("pki: no allowed peer role given: pass at least one of agent, coordinator, admin")
	}
	for _, r := range roles {
		switch r {
		case RoleAgent, RoleCoordinator, RoleAdmin:
		default:
			return fmt.Errorf("pki: role %q unknown: want agent, coordinator or admin", r)
		}
	}
	return nil
}

// RejectError is returned from a handshake rejected by this package.
type RejectError struct {
	Reason string // a Reason* constant
	Peer   string // "client" or "server"
	Err    error
}

func (e *RejectError) Error() string {
	return fmt.Sprintf("pki: %s certificate rejected (%s): %v", e.Peer, e.Reason, e.Err)
}

func (e *RejectError) Unwrap() error { return e.Err }

// ReasonOf returns the Reason* of a handshake error produced locally by this
// package, or "" when err is not one. Errors a peer reports with a TLS alert
// (e.g. our certificate was rejected by the server) are not RejectErrors.
func ReasonOf(err error) string {
	var re *RejectError
	if errors.As(err, &re) {
		return re.Reason
	}
	return ""
}

type verifier struct {
	pool     func() *x509.CertPool // the CA pool current at the handshake
	usage    x509.ExtKeyUsage
	roles    []string
	onReject func(string)
	peer     string
	now      func() time.Time // tests; nil means time.Now
}

func (v verifier) verify(cs tls.ConnectionState) error {
	reason, err := v.check(cs.PeerCertificates)
	if err == nil {
		return nil
	}
	if v.onReject != nil {
		v.onReject(reason)
	}
	return &RejectError{Reason: reason, Peer: v.peer, Err: err}
}

func (v verifier) check(certs []*x509.Certificate) (string, error) {
	if len(certs) == 0 {
		return ReasonNoCertificate, errors.New("no certificate presented")
	}
	leaf := certs[0]
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	now := time.Now()
	if v.now != nil {
		now = v.now()
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots:         v.pool(),
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{v.usage},
	})
	if err != nil {
		var inv x509.CertificateInvalidError
		var ua x509.UnknownAuthorityError
		switch {
		case errors.As(err, &inv) && inv.Reason == x509.Expired:
			return ReasonExpired, fmt.Errorf("%s: valid %s to %s, now %s: %w", describe(leaf),
				leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), err)
		case errors.As(err, &inv) && inv.Reason == x509.IncompatibleUsage:
			return ReasonWrongUsage, fmt.Errorf("%s: %w", describe(leaf), err)
		case errors.As(err, &ua):
			return ReasonUnknownCA, fmt.Errorf("%s: not issued by the configured CA (--tls-ca): %w", describe(leaf), err)
		default:
			return ReasonBadCertificate, fmt.Errorf("%s: %w", describe(leaf), err)
		}
	}
	role, err := RoleOf(leaf)
	if err != nil {
		return ReasonNoRole, fmt.Errorf("%s: %w", describe(leaf), err)
	}
	if !slices.Contains(v.roles, role) {
		return ReasonWrongRole, fmt.Errorf("%s: role %q not allowed here, want %s", describe(leaf), role, strings.Join(v.roles, " or "))
	}
	return "", nil
}

func describe(c *x509.Certificate) string {
	return fmt.Sprintf("certificate %q (serial %s)", c.Subject.CommonName, c.SerialNumber)
}

// RoleOf returns the role carried by cert's cutover://role/<role> URI SAN.
// It fails when there is none, more than one, or an unknown role.
func RoleOf(cert *x509.Certificate) (string, error) {
	var roles []string
	for _, u := range cert.URIs {
		if s := u.String(); strings.HasPrefix(s, roleURIPrefix) {
			roles = append(roles, strings.TrimPrefix(s, roleURIPrefix))
		}
	}
	switch len(roles) {
	case 0:
		return "", fmt.Errorf("no role: the certificate has no %s<role> URI SAN", roleURIPrefix)
	case 1:
	default:
		return "", fmt.Errorf("ambiguous role: the certificate has %d role URI SANs (%s), want exactly one", len(roles), strings.Join(roles, ", "))
	}
	switch roles[0] {
	case RoleAgent, RoleCoordinator, RoleAdmin:
		return roles[0], nil
	}
	return "", fmt.Errorf("unknown role %q: want agent, coordinator or admin", roles[0])
}
