package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// DebianRoot is the layer of a Debian root assembled from the .deb files
// a packages.txt of hack/agent-debs.sh lists (beside it, in its
// directory): each extracted with dpkg-deb -x, as dpkg would unpack it
// (no maintainer scripts run), without documentation (copyright files
// stay) and with the few files a minimal root needs (passwd, group, /tmp,
// /run, /var/run -> /run, /run/openvswitch). Entries are sorted, owned by
// 0:0 and dated 0.
func DebianRoot(packagesTxt, arch string) ([]byte, error) {
	debs, err := ReadPackages(packagesTxt)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "cutover-debian-root")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	for _, d := range debs {
		if !strings.HasSuffix(d.File, "_"+arch+".deb") && !strings.HasSuffix(d.File, "_all.deb") {
			return nil, fmt.Errorf("%s: %s is not for %s", packagesTxt, d.File, arch)
		}
		deb := d.File
		if !filepath.IsAbs(deb) {
			deb = filepath.Join(filepath.Dir(packagesTxt), deb)
		}
		if out, err := exec.Command("dpkg-deb", "-x", deb, dir).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("dpkg-deb -x %s: %w: %s", d.File, err, out)
		}
	}
	for _, p := range []string{"usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian", "usr/share/bash-completion"} {
		if err := os.RemoveAll(filepath.Join(dir, p)); err != nil {
			return nil, err
		}
	}
	docs, _ := filepath.Glob(filepath.Join(dir, "usr/share/doc/*/*"))
	for _, f := range docs {
		if filepath.Base(f) != "copyright" {
			if err := os.RemoveAll(f); err != nil {
				return nil, err
			}
		}
	}
	root := map[string]string{
		"etc/passwd":        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"etc/group":         "root:x:0:\nnogroup:x:65534:\n",
		"etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\nservices: files\nprotocols: files\n",
	}
	for p, data := range root {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(data), 0o644); err != nil {
			return nil, err
		}
	}
	for p, mode := range map[string]os.FileMode{"tmp": 0o1777, "run": 0o755, "run/openvswitch": 0o755, "root": 0o700, "var": 0o755, "var/log": 0o755, "var/lib/openvswitch": 0o755} {
		if err := os.MkdirAll(filepath.Join(dir, p), 0o755); err != nil {
			return nil, err
		}
		if mode&0o1000 != 0 {
			mode = mode&0o777 | os.ModeSticky
		}
		if err := os.Chmod(filepath.Join(dir, p), mode); err != nil {
			return nil, err
		}
	}
	// What the packages' maintainer scripts would have made: Debian's
	// default alternatives (iptables postinst: the nft backend). The agent
	// runs plain `iptables --version` when both backends hold as many
	// rules (pkg/iptables Detect).
	for link, target := range debianAlternatives {
		if _, err := os.Lstat(filepath.Join(dir, target)); err != nil {
			continue // the package is not in this root
		}
		if err := os.MkdirAll(filepath.Join(dir, "etc/alternatives"), 0o755); err != nil {
			return nil, err
		}
		alt := filepath.Join("etc/alternatives", filepath.Base(link))
		if err := os.Symlink("/"+target, filepath.Join(dir, alt)); err != nil {
			return nil, err
		}
		if err := os.Symlink("/"+alt, filepath.Join(dir, link)); err != nil && !os.IsExist(err) {
			return nil, err
		}
	}
	if err := os.RemoveAll(filepath.Join(dir, "var/run")); err != nil {
		return nil, err
	}
	if err := os.Symlink("/run", filepath.Join(dir, "var/run")); err != nil {
		return nil, err
	}
	return tarTree(dir)
}

// debianAlternatives are the update-alternatives links Debian's postinst
// scripts create by default: link → target.
var debianAlternatives = map[string]string{
	"usr/sbin/iptables":          "usr/sbin/iptables-nft",
	"usr/sbin/iptables-save":     "usr/sbin/iptables-nft-save",
	"usr/sbin/iptables-restore":  "usr/sbin/iptables-nft-restore",
	"usr/sbin/ip6tables":         "usr/sbin/ip6tables-nft",
	"usr/sbin/ip6tables-save":    "usr/sbin/ip6tables-nft-save",
	"usr/sbin/ip6tables-restore": "usr/sbin/ip6tables-nft-restore",
}

// Package is one line of packages.txt; File is relative to its directory
// (or absolute).
type Package struct{ Name, Version, File string }

// ReadPackages reads a packages.txt of hack/agent-debs.sh.
func ReadPackages(packagesTxt string) ([]Package, error) {
	f, err := os.Open(packagesTxt)
	if err != nil {
		return nil, fmt.Errorf("%w (fill the cache: make agent-debs)", err)
	}
	defer func() { _ = f.Close() }()
	var out []Package
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 3 {
			return nil, fmt.Errorf("%s: line %q: want \"<package> <version> <file>\"", packagesTxt, sc.Text())
		}
		out = append(out, Package{fs[0], fs[1], fs[2]})
	}
	if len(out) == 0 && sc.Err() == nil {
		return nil, fmt.Errorf("%s: no packages", packagesTxt)
	}
	return out, sc.Err()
}

// tarTree is the tar of dir's tree, entries in lexical order (a parent
// before its children), owner 0:0, time 0.
func tarTree(dir string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: int64(fi.Mode().Perm()), ModTime: epoch, Format: tar.FormatPAX}
		if fi.Mode()&os.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		if fi.Mode()&os.ModeSetuid != 0 {
			h.Mode |= 0o4000
		}
		if fi.Mode()&os.ModeSetgid != 0 {
			h.Mode |= 0o2000
		}
		var data []byte
		switch {
		case fi.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case fi.Mode()&os.ModeSymlink != 0:
			if h.Linkname, err = os.Readlink(p); err != nil {
				return err
			}
			h.Typeflag, h.Mode = tar.TypeSymlink, 0o777
		case fi.Mode().IsRegular():
			if data, err = os.ReadFile(p); err != nil {
				return err
			}
			h.Typeflag, h.Size = tar.TypeReg, int64(len(data))
		default:
			return fmt.Errorf("%s: not a file, directory or symlink", rel)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
