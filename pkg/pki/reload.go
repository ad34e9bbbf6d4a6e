package pki

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// DefaultReloadInterval is how often a Reloader looks at its files at most.
// cert-manager renews at two thirds of a certificate's life (day 60 of
// 90): any interval far under a day is enough; a few seconds keeps a
// rotated CA from refusing peers for long.
const DefaultReloadInterval = 5 * time.Second

// ReloadOptions tunes a Reloader.
type ReloadOptions struct {
	// Interval: the files are looked at again at most this often, on the
	// first handshake after it passed. 0 means DefaultReloadInterval.
	Interval time.Duration
	// OnError is called (when not nil) once for each new content of the
	// files that cannot be used (a half-written pair, a key that does not
	// match its certificate, a CA file without a certificate, a file gone):
	// the last good set stays in use. It runs inside a handshake: keep it
	// cheap. This package does not log; the caller counts and logs.
	OnError func(error)
	// OnReload is called (when not nil) after a new set was taken in use.
	OnReload func()
	now      func() time.Time // tests
}

// Reloader serves the CA pool and key pair of Files, re-read when their
// content changes, so that certificates renewed on disk (cert-manager
// rotates keys too) are used without a restart. Every check opens the
// files by path: a Kubernetes Secret volume swaps its content by
// re-pointing a ..data symlink, so an inode held open would be the old
// one forever.
//
// A set is taken in use only when the CA parses and the key matches the
// certificate: a pair read across a rotation (new certificate, old key) is
// refused, the previous set is kept, and the files are read again at the
// next interval. Handshakes already done are not affected by a reload:
// a connection keeps the certificates it was established with.
type Reloader struct {
	files Files
	opts  ReloadOptions

	mu      sync.Mutex
	checked time.Time         // last look at the files
	seen    [sha256.Size]byte // content of the last look, good or bad
	cur     *material
}

type material struct {
	pool *x509.CertPool
	pair *tls.Certificate
}

// NewReloader reads f now: a first set that cannot be used is an error,
// as for a config that is read once.
func NewReloader(f Files, opts ReloadOptions) (*Reloader, error) {
	if opts.Interval <= 0 {
		opts.Interval = DefaultReloadInterval
	}
	if opts.now == nil {
		opts.now = time.Now
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	raw, sum, err := f.read()
	if err != nil {
		return nil, err
	}
	m, err := f.parse(raw)
	if err != nil {
		return nil, err
	}
	return &Reloader{files: f, opts: opts, checked: opts.now(), seen: sum, cur: m}, nil
}

// Files returns the files r reads.
func (r *Reloader) Files() Files { return r.files }

// current returns the set in use, looking at the files first when the
// interval has passed.
func (r *Reloader) current() *material {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.opts.now()
	if now.Sub(r.checked) < r.opts.Interval {
		return r.cur
	}
	r.checked = now
	_ = r.refreshLocked() // reported through OnError; the last good set serves
	return r.cur
}

// Reload looks at the files now, whatever the interval, and returns why
// the new content was refused (nil: in use, or unchanged).
func (r *Reloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checked = r.opts.now()
	return r.refreshLocked()
}

func (r *Reloader) refreshLocked() error {
	raw, sum, err := r.files.read()
	if err == nil && sum == r.seen {
		return nil // unchanged since the last look, good or bad
	}
	var m *material
	if err == nil {
		m, err = r.files.parse(raw)
		if err != nil {
			// Read across a rotation? Read once more before calling
			// the content bad: a writer that is not atomic per
			// directory (a copy, an editor) may have been half way.
			if raw2, sum2, err2 := r.files.read(); err2 == nil && sum2 != sum {
				if m2, err3 := r.files.parse(raw2); err3 == nil {
					m, sum, err = m2, sum2, nil
				}
			}
		}
	}
	if err != nil {
		// A file that cannot be read is not remembered as seen: it is
		// retried, and counted once per distinct content otherwise.
		if sum != ([sha256.Size]byte{}) {
			r.seen = sum
		}
		err = fmt.Errorf("pki: reload of %s, %s, %s refused, still using the certificates loaded before: %w", r.files.CA, r.files.Cert, r.files.Key, err)
		if r.opts.OnError != nil {
			r.opts.OnError(err)
		}
		return err
	}
	r.seen, r.cur = sum, m
	if r.opts.OnReload != nil {
		r.opts.OnReload()
	}
	return nil
}

// Certificate returns the leaf in use (for tests and status pages).
func (r *Reloader) Certificate() *x509.Certificate { return r.current().pair.Leaf }

func (r *Reloader) pool() *x509.CertPool { return r.current().pool }

func (r *Reloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.current().pair, nil
}

func (r *Reloader) getClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return r.current().pair, nil
}

type rawFiles struct{ ca, cert, key []byte }

// read reads the three files by path; sum is the hash of their content.
func (f Files) read() (rawFiles, [sha256.Size]byte, error) {
	var raw rawFiles
	var errs []error
	for _, x := range []struct {
		flag, path string
		dst        *[]byte
	}{{"tls-ca", f.CA, &raw.ca}, {"tls-cert", f.Cert, &raw.cert}, {"tls-key", f.Key, &raw.key}} {
		b, err := os.ReadFile(x.path)
		if err != nil {
			errs = append(errs, fmt.Errorf("--%s %q: %w", x.flag, x.path, err))
		}
		*x.dst = b
	}
	if err := errors.Join(errs...); err != nil {
		return raw, [sha256.Size]byte{}, err
	}
	h := sha256.New()
	for _, b := range [][]byte{raw.ca, raw.cert, raw.key} {
		_, _ = fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	var sum [sha256.Size]byte
	copy(sum[:], h.Sum(nil))
	return raw, sum, nil
}

// parse checks and builds a set: the CA has a certificate, the key
// matches the certificate's public key (tls.X509KeyPair checks that).
func (f Files) parse(raw rawFiles) (*material, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(raw.ca) {
		return nil, fmt.Errorf("--tls-ca %q: no PEM CERTIFICATE block in it", f.CA)
	}
	pair, err := tls.X509KeyPair(raw.cert, raw.key)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %q / --tls-key %q: %w", f.Cert, f.Key, err)
	}
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("--tls-cert %q: %w", f.Cert, err)
		}
	}
	return &material{pool: pool, pair: &pair}, nil
}
