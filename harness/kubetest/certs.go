package kubetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the throw-away PKI of one test apiserver: a CA that signs the
// serving certificate and the admin client certificate, and the
// service-account signing key.
type pki struct {
	caPEM, serverCertPEM, serverKeyPEM, adminCertPEM, adminKeyPEM []byte
}

// files are the paths kube-apiserver reads.
type pkiFiles struct {
	ca, serverCert, serverKey, saKey, saPub string
}

func newPKI(dir string) (*pki, pkiFiles, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, pkiFiles{}, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "cutover-kubetest-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, pkiFiles{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, pkiFiles{}, err
	}
	leaf := func(serial int64, tmpl *x509.Certificate) (certPEM, keyPEM []byte, err error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, nil, err
		}
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return nil, nil, err
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return nil, nil, err
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
	}
	p := &pki{caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})}
	// Serving certificate: loopback only; the apiserver binds nothing else.
	p.serverCertPEM, p.serverKeyPEM, err = leaf(2, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.ParseIP(ServiceClusterIP)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, pkiFiles{}, err
	}
	// Admin: system:masters bypasses RBAC, so a test sets up objects freely
	// and checks least privilege by impersonating a service account.
	p.adminCertPEM, p.adminKeyPEM, err = leaf(3, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "cutover-kubetest-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, pkiFiles{}, err
	}
	// The service-account token signer must be RSA or ECDSA; RSA-2048 is
	// what kubeadm generates, so tokens look like a real cluster's.
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, pkiFiles{}, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, pkiFiles{}, err
	}
	f := pkiFiles{
		ca:         filepath.Join(dir, "ca.crt"),
		serverCert: filepath.Join(dir, "apiserver.crt"),
		serverKey:  filepath.Join(dir, "apiserver.key"),
		saKey:      filepath.Join(dir, "sa.key"),
		saPub:      filepath.Join(dir, "sa.pub"),
	}
	for path, data := range map[string][]byte{
		f.ca:         p.caPEM,
		f.serverCert: p.serverCertPEM,
		f.serverKey:  p.serverKeyPEM,
		f.saKey:      pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}),
		f.saPub:      pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER}),
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return nil, pkiFiles{}, fmt.Errorf("kubetest: write %s: %w", path, err)
		}
	}
	return p, f, nil
}
