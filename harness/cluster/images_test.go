package cluster_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// e2eImages are the release's image tarballs (OCI layouts, as make images
// writes them) that the tier imports into every node: there is no
// registry.
type e2eImages struct {
	dir, version string
	bin          string // linux-amd64 binaries: the agent, coordctl, kubectl-cutover
	agent        string // tarballs
	coordinator  string
	pause        string
	agentV2      string            // the upgrade's agent tarball, once built
	pinned       map[string]string // repository -> repository@sha256:digest (images.txt)
	pauseRef     string
}

const (
	agentRepo = "ghcr.io/cutover-dev/cutover-agent"
	coordRepo = "ghcr.io/cutover-dev/cutover-coordinator"
	pauseRepo = "ghcr.io/cutover-dev/cutover-pause"
)

// buildImages builds the shipped binaries for linux/amd64 and their images
// with the release's image tool (harness/cmd/cutover-image, what make
// images runs) into a directory of the test's.
func buildImages(t *testing.T, version string) e2eImages {
	t.Helper()
	dir := t.TempDir()
	im := e2eImages{dir: dir, version: version, bin: filepath.Join(dir, "bin", "linux-amd64")}
	root := repoRoot(t)
	build := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X github.com/cutover-dev/cutover/pkg/version.Version="+version, "-o", im.bin+"/",
		"./agent/cmd/agent", "./coordinator/cmd/coordinator", "./coordinator/cmd/coordctl", "./coordinator/cmd/kubectl-cutover", "./harness/cmd/cutover-pause")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out := filepath.Join(dir, "release")
	im.pinned = imageTool(t, root, version, filepath.Join(dir, "bin"), out)
	im.agent = filepath.Join(out, "cutover-agent-"+version+".tar")
	im.coordinator = filepath.Join(out, "cutover-coordinator-"+version+".tar")
	im.pause = filepath.Join(out, "cutover-pause-"+version+".tar")
	im.pauseRef = pauseRepo + ":" + version
	return im
}

// imageTool runs the release's image tool and returns images.txt's pins.
func imageTool(t *testing.T, root, version, bin, out string) map[string]string {
	t.Helper()
	cmd := exec.Command("go", "run", "./harness/cmd/cutover-image", "--version", version, "--bin", bin, "--out", out, "--arch", "amd64")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cutover-image (make agent-debs fills the package cache it needs): %v\n%s", err, b)
	}
	b, err := os.ReadFile(filepath.Join(out, "images.txt"))
	if err != nil {
		t.Fatal(err)
	}
	pins := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l) // file ref repo@digest
		if len(f) == 3 {
			pins[strings.SplitN(f[2], "@", 2)[0]] = f[2]
		}
	}
	return pins
}

// buildAgentImage builds the images again under another version (an
// upgrade's) and returns the agent's tarball and its pinned reference.
func buildAgentImage(t *testing.T, im e2eImages, version string) (string, string) {
	t.Helper()
	out := filepath.Join(im.dir, "release-"+version)
	pins := imageTool(t, repoRoot(t), version, filepath.Join(im.dir, "bin"), out)
	return filepath.Join(out, "cutover-agent-"+version+".tar"), pins[agentRepo]
}

func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}
