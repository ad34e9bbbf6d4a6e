package pki

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// secretVolume lays files out as the kubelet mounts a Secret: the visible
// names are symlinks into ..data, itself a symlink to a timestamped
// directory, swapped by renaming a new symlink over ..data.
type secretVolume struct {
	t   *testing.T
	dir string
	gen int
}

func newSecretVolume(t *testing.T, ca, cert, key []byte) *secretVolume {
	v := &secretVolume{t: t, dir: t.TempDir()}
	v.swap(ca, cert, key)
	for _, n := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if err := os.Symlink(filepath.Join("..data", n), filepath.Join(v.dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

func (v *secretVolume) files() Files {
	return Files{CA: filepath.Join(v.dir, "ca.crt"), Cert: filepath.Join(v.dir, "tls.crt"), Key: filepath.Join(v.dir, "tls.key")}
}

// swap publishes a new generation atomically, as the kubelet does.
func (v *secretVolume) swap(ca, cert, key []byte) {
	t := v.t
	v.gen++
	ts := fmt.Sprintf("..gen_%d", v.gen)
	if err := os.Mkdir(filepath.Join(v.dir, ts), 0o700); err != nil {
		t.Fatal(err)
	}
	for n, b := range map[string][]byte{"ca.crt": ca, "tls.crt": cert, "tls.key": key} {
		if err := os.WriteFile(filepath.Join(v.dir, ts, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// overwrite writes one file in place, as a careless writer would.
func (v *secretVolume) overwrite(name string, b []byte) {
	if err := os.WriteFile(filepath.Join(v.dir, name), b, 0o600); err != nil {
		v.t.Fatal(err)
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func leafOf(t *testing.T, f Files) *x509.Certificate { t.Helper(); return readCert(t, f.Cert) }

// echoServer serves lines back over TLS on loopback until the test ends.
func echoServer(t *testing.T, tc *tls.Config) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", tc)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { _ = c.Close() }()
				_ = c.SetDeadline(time.Now().Add(20 * time.Second))
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

// dial connects, completes the handshake (the server's verdict on our
// certificate included: one echo) and returns the connection.
func dial(t *testing.T, addr string, tc *tls.Config) (*tls.Conn, error) {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, tc)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := echo(c, "hello"); err != nil {
		return nil, err
	}
	return c, nil
}

func echo(c *tls.Conn, s string) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(s + "\n")); err != nil {
		return err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if got != s+"\n" {
		return fmt.Errorf("echo %q, want %q", got, s)
	}
	return nil
}

// TestReloadUnderLiveServer rotates a server's and a client's files (a
// renewal with new keys, then a CA rotation) while a connection stays up:
// each new handshake uses what is on disk, the old connection carries on,
// and a broken pair is refused with the last good one kept.
func TestReloadUnderLiveServer(t *testing.T) {
	dir1 := lab(t) // CA1
	dir2 := lab(t) // CA2: the rotated CA
	ca1, ca2 := mustRead(t, filepath.Join(dir1, CAFile)), mustRead(t, filepath.Join(dir2, CAFile))
	bundle := append(append([]byte{}, ca1...), ca2...)
	agent1 := AgentFiles(dir1, "n1")

	srvVol := newSecretVolume(t, ca1, mustRead(t, agent1.Cert), mustRead(t, agent1.Key))
	var mu sync.Mutex
	var reloadErrs []error
	srvR, err := NewReloader(srvVol.files(), ReloadOptions{Interval: time.Nanosecond, OnError: func(err error) {
		mu.Lock()
		defer mu.Unlock()
		reloadErrs = append(reloadErrs, err)
	}})
	if err != nil {
		t.Fatal(err)
	}
	srvCfg, err := ReloadingServerConfig(srvR, nil, RoleCoordinator)
	if err != nil {
		t.Fatal(err)
	}
	addr := echoServer(t, srvCfg)

	coord1 := CoordinatorFiles(dir1)
	cliVol := newSecretVolume(t, ca1, mustRead(t, coord1.Cert), mustRead(t, coord1.Key))
	cliR, err := NewReloader(cliVol.files(), ReloadOptions{Interval: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	cliCfg, err := ReloadingClientConfig(cliR, nil, RoleAgent)
	if err != nil {
		t.Fatal(err)
	}

	live, err := dial(t, addr, cliCfg)
	if err != nil {
		t.Fatal(err)
	}
	serverLeaf := func(c *tls.Conn) *x509.Certificate { return c.ConnectionState().PeerCertificates[0] }
	if got, want := serverLeaf(live).SerialNumber, leafOf(t, agent1).SerialNumber; got.Cmp(want) != 0 {
		t.Fatalf("server presented serial %s, want %s", got, want)
	}

	// 1. Renewal: same CA, new certificate and key (cert-manager's
	// rotationPolicy: Always). Issue again into dir1 reuses CA1.
	if err := Issue(dir1, IssueOptions{Agents: []AgentIdentity{{Name: "n1"}}, Validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	renewed := leafOf(t, agent1)
	srvVol.swap(ca1, mustRead(t, agent1.Cert), mustRead(t, agent1.Key))
	c, err := dial(t, addr, cliCfg)
	if err != nil {
		t.Fatalf("handshake after renewal: %v", err)
	}
	if got := serverLeaf(c).SerialNumber; got.Cmp(renewed.SerialNumber) != 0 {
		t.Fatalf("after renewal the server presented serial %s, want the renewed %s", got, renewed.SerialNumber)
	}
	if err := echo(live, "still there after renewal"); err != nil {
		t.Fatalf("connection made before the renewal: %v", err)
	}

	// 2. CA rotation: both sides trust CA1+CA2 first, then the server
	// moves to a CA2 certificate, then a client with a CA2 certificate
	// comes.
	srvVol.swap(bundle, mustRead(t, agent1.Cert), mustRead(t, agent1.Key))
	cliVol.swap(bundle, mustRead(t, coord1.Cert), mustRead(t, coord1.Key))
	agent2 := AgentFiles(dir2, "n1")
	srvVol.swap(bundle, mustRead(t, agent2.Cert), mustRead(t, agent2.Key))
	c, err = dial(t, addr, cliCfg)
	if err != nil {
		t.Fatalf("handshake after the server moved to CA2: %v", err)
	}
	if got := serverLeaf(c); !bytes.Equal(got.Raw, leafOf(t, agent2).Raw) {
		t.Fatalf("server presented %s from %s, want the CA2 certificate", got.SerialNumber, got.Issuer)
	}
	coord2 := CoordinatorFiles(dir2)
	cliVol.swap(bundle, mustRead(t, coord2.Cert), mustRead(t, coord2.Key))
	if _, err := dial(t, addr, cliCfg); err != nil {
		t.Fatalf("client with a CA2 certificate refused: %v", err)
	}
	// A server that dropped CA1 refuses CA1 clients from the next handshake.
	srvVol.swap(ca2, mustRead(t, agent2.Cert), mustRead(t, agent2.Key))
	old, err := ClientConfig(Files{CA: filepath.Join(dir2, CAFile), Cert: coord1.Cert, Key: coord1.Key}, RoleAgent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dial(t, addr, old); err == nil {
		t.Fatal("a CA1 client was accepted after the server's CA bundle dropped CA1")
	}
	if err := echo(live, "still there after the CA rotation"); err != nil {
		t.Fatalf("connection made before the CA rotation: %v", err)
	}

	// 3. A half-written pair: the certificate of a new generation beside
	// the key of the previous one. Refused, counted once, last good kept.
	good := leafOf(t, agent2)
	if err := Issue(dir2, IssueOptions{Agents: []AgentIdentity{{Name: "n1"}}, Validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	srvVol.overwrite(filepath.Join("..data", "tls.crt"), mustRead(t, agent2.Cert))
	for i := 0; i < 3; i++ {
		c, err = dial(t, addr, cliCfg)
		if err != nil {
			t.Fatalf("handshake with a broken pair on disk: %v", err)
		}
		if got := serverLeaf(c); !bytes.Equal(got.Raw, good.Raw) {
			t.Fatalf("with a broken pair on disk the server presented serial %s, want the last good %s", got.SerialNumber, good.SerialNumber)
		}
	}
	mu.Lock()
	n := len(reloadErrs)
	var first error
	if n > 0 {
		first = reloadErrs[0]
	}
	mu.Unlock()
	if n != 1 || !strings.Contains(first.Error(), "private key does not match public key") {
		t.Fatalf("reload errors = %d (%v), want 1 naming the mismatched key", n, first)
	}
	// The key arrives: the new pair is taken.
	srvVol.overwrite(filepath.Join("..data", "tls.key"), mustRead(t, agent2.Key))
	c, err = dial(t, addr, cliCfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := serverLeaf(c); !bytes.Equal(got.Raw, leafOf(t, agent2).Raw) {
		t.Fatalf("after the key arrived the server presented serial %s, want the new one", got.SerialNumber)
	}
	if err := echo(live, "still there at the end"); err != nil {
		t.Fatal(err)
	}
}

// TestReloadInterval: the files are looked at no more often than the
// interval, and a vanished file keeps the last good set.
func TestReloadInterval(t *testing.T) {
	dir := lab(t)
	f := AgentFiles(dir, "n1")
	vol := newSecretVolume(t, mustRead(t, f.CA), mustRead(t, f.Cert), mustRead(t, f.Key))
	now := time.Unix(1000, 0)
	var errs []error
	r, err := NewReloader(vol.files(), ReloadOptions{Interval: 10 * time.Second, now: func() time.Time { return now },
		OnError: func(err error) { errs = append(errs, err) }})
	if err != nil {
		t.Fatal(err)
	}
	first := r.Certificate()
	if err := Issue(dir, IssueOptions{Agents: []AgentIdentity{{Name: "n1"}}, Validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	vol.swap(mustRead(t, f.CA), mustRead(t, f.Cert), mustRead(t, f.Key))
	now = now.Add(9 * time.Second)
	if r.Certificate() != first {
		t.Fatal("files read again before the interval passed")
	}
	now = now.Add(time.Second)
	if got := r.Certificate(); got.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("files not read again once the interval passed")
	}
	cur := r.Certificate()
	if err := os.Remove(filepath.Join(vol.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	err = r.Reload()
	var pe *os.PathError
	if !errors.As(err, &pe) || r.Certificate() != cur || len(errs) != 1 {
		t.Fatalf("files gone: err %v, %d errors reported, certificate kept %v", err, len(errs), r.Certificate() == cur)
	}
}

// TestNewReloaderRefusesBrokenPair: the first set must be good.
func TestNewReloaderRefusesBrokenPair(t *testing.T) {
	dir := lab(t)
	f := AgentFiles(dir, "n1")
	f.Key = CoordinatorFiles(dir).Key
	if _, err := NewReloader(f, ReloadOptions{}); err == nil || !strings.Contains(err.Error(), "--tls-key") {
		t.Fatalf("err = %v, want a mismatched pair naming --tls-key", err)
	}
}
