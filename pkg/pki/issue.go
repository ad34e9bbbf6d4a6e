package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"github.com/cutover-dev/cutover/pkg/atomicfile"
)

// File names Issue writes into its directory.
const (
	CAFile    = "ca.pem"
	CAKeyFile = "ca-key.pem"
)

// AgentIdentity names one agent certificate to issue.
type AgentIdentity struct {
	Name string   // node name: a DNS-1123 subdomain; also a DNS SAN
	IPs  []net.IP // extra IP SANs besides 127.0.0.1
}

// IssueOptions configures Issue.
type IssueOptions struct {
	Agents         []AgentIdentity
	CoordinatorIPs []net.IP      // extra IP SANs of the coordinator besides 127.0.0.1
	Validity       time.Duration // of every certificate issued (and of a new CA)
	Now            func() time.Time
}

// CoordinatorFiles, AdminFiles and AgentFiles name the files Issue writes
// for each identity in dir, so binaries and labs agree on the layout.
func CoordinatorFiles(dir string) Files { return filesIn(dir, "coordinator") }

// AdminFiles is the coordctl identity in dir.
func AdminFiles(dir string) Files { return filesIn(dir, "admin") }

// AgentFiles is the identity of agent name in dir. Agent files are prefixed
// "agent-" so that a node called "admin" or "ca" cannot collide.
func AgentFiles(dir, name string) Files { return filesIn(dir, "agent-"+name) }

func filesIn(dir, base string) Files {
	return Files{
		CA:   filepath.Join(dir, CAFile),
		Cert: filepath.Join(dir, base+".pem"),
		Key:  filepath.Join(dir, base+"-key.pem"),
	}
}

var dns1123 = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// Validate checks the options and names the field at fault.
func (o IssueOptions) Validate() error {
	var errs []error
	if o.Validity <= 0 {
		errs = append(errs, fmt.Errorf("validity %s: must be positive (e.g. 720h)", o.Validity))
	}
	seen := map[string]bool{}
	for i, a := range o.Agents {
		switch {
		case a.Name == "":
			errs = append(errs, fmt.Errorf("agents[%d]: empty name", i))
		case len(a.Name) > 253 || !dns1123.MatchString(a.Name):
			errs = append(errs, fmt.Errorf("agent name %q: not a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', at most 253)", a.Name))
		case seen[a.Name]:
			errs = append(errs, fmt.Errorf("agent name %q: given twice", a.Name))
		}
		seen[a.Name] = true
		for _, ip := range a.IPs {
			if ip == nil || ip.IsUnspecified() {
				errs = append(errs, fmt.Errorf("agent %q: IP %v is not a usable address", a.Name, ip))
			}
		}
	}
	for _, ip := range o.CoordinatorIPs {
		if ip == nil || ip.IsUnspecified() {
			errs = append(errs, fmt.Errorf("coordinator IP %v is not a usable address", ip))
		}
	}
	return errors.Join(errs...)
}

// Issue writes a lab PKI into dir (created 0700 when missing): ca.pem and
// ca-key.pem; coordinator.pem/-key.pem (role coordinator, serverAuth and
// clientAuth: it serves coordctl and dials agents); admin.pem/-key.pem
// (role admin, clientAuth: coordctl); and agent-<name>.pem/-key.pem per
// agent (role agent, serverAuth and clientAuth; SANs: the name, 127.0.0.1
// and the given IPs). Keys are ECDSA P-256, written 0600.
//
// When dir already holds ca.pem and ca-key.pem, that CA is reused, so Issue
// can be run again to add agents to an existing lab; the certificates named
// by this call are rewritten. Leaf validity is clamped to the CA's.
func Issue(dir string, o IssueOptions) error {
	if err := o.Validate(); err != nil {
		return fmt.Errorf("pki: issue: %w", err)
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pki: issue: %w", err)
	}
	ca, err := loadOrCreateCA(dir, now(), o.Validity)
	if err != nil {
		return fmt.Errorf("pki: issue: %w", err)
	}
	loop := net.IPv4(127, 0, 0, 1)
	leaves := []struct {
		base  string
		spec  leafSpec
		files Files
	}{
		{"coordinator", leafSpec{cn: "cutover-coordinator", role: RoleCoordinator, server: true, client: true,
			dns: []string{"cutover-coordinator", "localhost"}, ips: append([]net.IP{loop}, o.CoordinatorIPs...)}, CoordinatorFiles(dir)},
		{"admin", leafSpec{cn: "cutover-admin", role: RoleAdmin, client: true}, AdminFiles(dir)},
	}
	for _, a := range o.Agents {
		leaves = append(leaves, struct {
			base  string
			spec  leafSpec
			files Files
		}{a.Name, leafSpec{cn: a.Name, role: RoleAgent, server: true, client: true,
			dns: []string{a.Name}, ips: append([]net.IP{loop}, a.IPs...)}, AgentFiles(dir, a.Name)})
	}
	for _, l := range leaves {
		certPEM, keyPEM, err := ca.issue(l.spec, now(), o.Validity)
		if err != nil {
			return fmt.Errorf("pki: issue %s: %w", l.base, err)
		}
		if err := writeFile(l.files.Cert, certPEM, 0o644); err != nil {
			return fmt.Errorf("pki: issue %s: %w", l.base, err)
		}
		if err := writeFile(l.files.Key, keyPEM, 0o600); err != nil {
			return fmt.Errorf("pki: issue %s: %w", l.base, err)
		}
	}
	return nil
}

type authority struct {
	cert *x509.Certificate
	key  crypto.Signer
}

type leafSpec struct {
	cn             string
	role           string
	server, client bool
	dns            []string
	ips            []net.IP
}

func loadOrCreateCA(dir string, now time.Time, validity time.Duration) (*authority, error) {
	certPath, keyPath := filepath.Join(dir, CAFile), filepath.Join(dir, CAKeyFile)
	_, certErr := os.Stat(certPath)
	_, keyErr := os.Stat(keyPath)
	switch {
	case certErr == nil && keyErr == nil:
		return loadCA(certPath, keyPath)
	case certErr == nil || keyErr == nil:
		return nil, fmt.Errorf("%s: has only one of %s and %s: remove it or restore the other", dir, CAFile, CAKeyFile)
	}
	ca, err := newCA(now, validity)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, err
	}
	if err := writeFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, err
	}
	if err := writeFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}), 0o644); err != nil {
		return nil, err
	}
	return ca, nil
}

func loadCA(certPath, keyPath string) (*authority, error) {
	cb, err := os.ReadFile(certPath)
	if err != nil {
		return nil, err
	}
	kb, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	cblk, _ := pem.Decode(cb)
	if cblk == nil || cblk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: no PEM CERTIFICATE block", certPath)
	}
	cert, err := x509.ParseCertificate(cblk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certPath, err)
	}
	kblk, _ := pem.Decode(kb)
	if kblk == nil {
		return nil, fmt.Errorf("%s: no PEM block", keyPath)
	}
	k, err := x509.ParsePKCS8PrivateKey(kblk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyPath, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s: key of type %T cannot sign", keyPath, k)
	}
	return &authority{cert: cert, key: signer}, nil
}

func newCA(now time.Time, validity time.Duration) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := randSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "cutover lab CA", Organization: []string{"cutover"}},
		NotBefore:             now.Add(-time.Minute), // tolerate small clock skew between lab nodes
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &authority{cert: cert, key: key}, nil
}

// issue signs a leaf valid from now-1m to now+validity (clamped to the CA).
func (a *authority) issue(s leafSpec, now time.Time, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := randSerial()
	if err != nil {
		return nil, nil, err
	}
	notAfter := now.Add(validity)
	if notAfter.After(a.cert.NotAfter) {
		notAfter = a.cert.NotAfter
	}
	var eku []x509.ExtKeyUsage
	if s.server {
		eku = append(eku, x509.ExtKeyUsageServerAuth)
	}
	if s.client {
		eku = append(eku, x509.ExtKeyUsageClientAuth)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: s.cn, Organization: []string{"cutover"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           eku,
		BasicConstraintsValid: true,
		DNSNames:              s.dns,
		IPAddresses:           s.ips,
	}
	if s.role != "" {
		tmpl.URIs = []*url.URL{RoleURI(s.role)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, key.Public(), a.key)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

func randSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// writeFile writes atomically so that a reader (an agent starting while
// coordctl certs runs) never sees half a PEM.
func writeFile(path string, data []byte, mode os.FileMode) error {
	return atomicfile.WriteFile(path, data, mode)
}
