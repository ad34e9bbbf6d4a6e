package deploy_test

// make release, run for real with one overlay and one image architecture
// (the make target does all four overlays and both architectures): every
// file it writes is in SHA256SUMS with its sum, the manifests pin the
// images to the digests of the tarballs it built and never use a tag, the
// CLIs exist for every OS and architecture, and the notes are the
// CHANGELOG section. A VERSION that is not vX.Y.Z, or has no CHANGELOG
// section, is refused naming the variable, the value and why.

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/harness/image"
	"github.com/cutover-dev/cutover/harness/testenv"
)

const releaseVersion = "v0.0.99"

func makeRelease(t *testing.T, root, version, changelog string) (string, error) {
	t.Helper()
	cmd := exec.Command("make", "--no-print-directory", "release", "VERSION="+version, "RELEASE_DIR="+root,
		"RELEASE_OVERLAYS=flannel", "IMAGE_ARCHES="+runtime.GOARCH)
	cmd.Dir, cmd.Env = "..", append(os.Environ(), "CHANGELOG="+changelog)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestReleaseRefusesBadVersions(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make not in PATH")
	}
	root := t.TempDir()
	changelog, err := filepath.Abs("../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	for version, want := range map[string]string{
		"1.2.3":        `VERSION="1.2.3": not a release version: want vMAJOR.MINOR.PATCH`,
		"v1.2":         `VERSION="v1.2": not a release version`,
		"v1.2.3-rc.1":  `VERSION="v1.2.3-rc.1": not a release version`,
		"v01.2.3":      `VERSION="v01.2.3": not a release version`,
		"v9.9.9":       `has no "## [9.9.9]" section for VERSION=v9.9.9`,
		"v1.2.3-dirty": `VERSION="v1.2.3-dirty"`,
	} {
		out, err := makeRelease(t, root, version, changelog)
		if err == nil || !strings.Contains(out, want) {
			t.Errorf("make release VERSION=%s: %v, output lacks %q:\n%s", version, err, want, out)
		}
	}
	if ents, _ := os.ReadDir(root); len(ents) > 0 {
		t.Errorf("a refused release wrote %v", ents)
	}
}

func TestRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds images and 8 CLIs")
	}
	cache := os.Getenv("CUTOVER_CACHE_DIR")
	if cache == "" {
		c, _ := os.UserCacheDir()
		cache = filepath.Join(c, "cutover")
	}
	if _, err := os.Stat(filepath.Join(cache, "debs", runtime.GOARCH, "packages.txt")); err != nil {
		msg := "no Debian packages cached for the agent image: run make agent-debs"
		if testenv.InCI() {
			t.Fatal(msg + " (CI runs it before the tests)")
		}
		t.Skip(msg)
	}
	root := t.TempDir()
	changelog := filepath.Join(t.TempDir(), "CHANGELOG.md")
	section := "## [0.0.99]\n\n### Added\n\n- The release test's own section.\n"
	if err := os.WriteFile(changelog, []byte("# Changelog\n\n## [Unreleased]\n\n"+section+"\n## [0.0.98]\n\n- older\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := makeRelease(t, root, releaseVersion, changelog)
	if err != nil {
		t.Fatalf("make release: %v\n%s", err, out)
	}
	dir := filepath.Join(root, releaseVersion)

	// SHA256SUMS lists every other file, each with its sum.
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		sum, name, ok := strings.Cut(l, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", l)
		}
		listed[strings.TrimPrefix(name, "./")] = sum
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range ents {
		if e.Name() == "SHA256SUMS" {
			continue
		}
		files = append(files, e.Name())
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.Sum256(b)
		if listed[e.Name()] != hex.EncodeToString(h[:]) {
			t.Errorf("%s: SHA256SUMS says %q, the file's sum is %x", e.Name(), listed[e.Name()], h)
		}
		delete(listed, e.Name())
	}
	for n := range listed {
		t.Errorf("SHA256SUMS lists %s, which the release does not hold", n)
	}

	// The artefacts.
	want := []string{"RELEASE-NOTES.md", "cutover-flannel-" + releaseVersion + ".yaml", "images.txt"}
	for _, n := range []string{"cutover-agent", "cutover-coordinator", "cutover-pause"} {
		want = append(want, n+"-"+releaseVersion+".tar")
	}
	for _, os := range []string{"linux", "darwin"} {
		for _, a := range []string{"amd64", "arm64"} {
			want = append(want, "coordctl-"+releaseVersion+"-"+os+"-"+a, "kubectl-cutover-"+releaseVersion+"-"+os+"-"+a)
		}
	}
	slices.Sort(want)
	if !slices.Equal(files, want) {
		t.Errorf("release files:\n%v\nwant:\n%v", files, want)
	}

	// The manifests pin each image to the digest of the tarball built.
	manifest, err := os.ReadFile(filepath.Join(dir, "cutover-flannel-"+releaseVersion+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	images := regexp.MustCompile(`(?m)^\s*image:\s*(\S+)`).FindAllSubmatch(manifest, -1)
	if len(images) == 0 {
		t.Fatal("the manifests name no image")
	}
	pinned := map[string]string{}
	for _, m := range images {
		ref := string(m[1])
		repo, digest, ok := strings.Cut(ref, "@")
		if !ok || !strings.HasPrefix(digest, "sha256:") || strings.Contains(repo, ":") {
			t.Errorf("image %s: not pinned by digest alone (repo@sha256:...)", ref)
		}
		pinned[repo] = digest
	}
	if strings.Contains(string(manifest), ":latest") {
		t.Error("the manifests use :latest")
	}
	for _, n := range []string{"cutover-agent", "cutover-coordinator"} {
		c, err := image.Inspect(filepath.Join(dir, n+"-"+releaseVersion+".tar"), runtime.GOARCH)
		if err != nil {
			t.Fatal(err)
		}
		if c.Ref != "ghcr.io/cutover-dev/"+n+":"+releaseVersion {
			t.Errorf("%s tarball names %s", n, c.Ref)
		}
		if got := pinned["ghcr.io/cutover-dev/"+n]; got != c.Digest.String() {
			t.Errorf("manifests pin %s to %q, the tarball's index digest is %s", n, got, c.Digest)
		}
	}

	notes, err := os.ReadFile(filepath.Join(dir, "RELEASE-NOTES.md"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(notes)) != strings.TrimSpace(section) {
		t.Errorf("RELEASE-NOTES.md:\n%s\nwant the CHANGELOG section:\n%s", notes, section)
	}
	// The CLI for this machine reports the version.
	ctl := filepath.Join(dir, "coordctl-"+releaseVersion+"-linux-"+runtime.GOARCH)
	if out, err := exec.Command(ctl, "version").CombinedOutput(); err != nil || !strings.Contains(string(out), releaseVersion) {
		t.Errorf("%s version: %v %q", ctl, err, out)
	}
}
