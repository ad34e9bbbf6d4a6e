// cutover-image builds the release images as image tarballs from the
// static binaries in --bin (make images), without a registry or a
// container engine, then reads each tarball back and checks it
// (harness/image). The coordinator image needs nothing else. The agent
// execs iptables and nft, so its image needs a base that carries them
// (--agent-base: an image tarball, e.g. `docker save` of Dockerfile.agent's
// runtime stage); without one it is not built, and the command says so.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/cutover-dev/cutover/harness/image"
)

func main() {
	fs := pflag.NewFlagSet("cutover-image", pflag.ExitOnError)
	version := fs.String("version", "", "the build's VERSION (image tag and "+image.VersionLabel+" label)")
	bin := fs.String("bin", "bin", "directory of the static agent, coordinator and coordctl (make build)")
	out := fs.String("out", "bin/release", "directory the tarballs are written to")
	repo := fs.String("repo", "ghcr.io/cutover-dev", "image repository prefix (as in deploy/base/kustomization.yaml)")
	agentBase := fs.String("agent-base", "", "image tarball of the agent's base (Debian with iptables and nftables); empty: the agent image is not built")
	agentBaseRef := fs.String("agent-base-ref", "", "tag of the base in --agent-base when it holds several")
	_ = fs.Parse(os.Args[1:])
	if err := run(*version, *bin, *out, *repo, *agentBase, *agentBaseRef); err != nil {
		fmt.Fprintln(os.Stderr, "cutover-image:", err)
		os.Exit(1)
	}
}

func run(version, bin, out, repo, agentBase, agentBaseRef string) error {
	if version == "" {
		return fmt.Errorf("--version: empty")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	specs := []image.Spec{image.Coordinator(repo+"/cutover-coordinator:"+version, version, bin)}
	if agentBase != "" {
		s := image.Agent(repo+"/cutover-agent:"+version, version, bin, agentBase)
		s.BaseRef = agentBaseRef
		specs = append(specs, s)
	} else {
		fmt.Println("agent image: not built: it needs a base with iptables and nftables (--agent-base / make images AGENT_BASE=file.tar); build it with Dockerfile.agent where a registry is reachable")
	}
	for _, s := range specs {
		file := filepath.Join(out, filepath.Base(s.Ref[:len(s.Ref)-len(version)-1])+"-"+version+".tar")
		d, err := image.Build(s, file)
		if err != nil {
			return err
		}
		c, err := image.Inspect(file, s.Ref)
		if err != nil {
			return err
		}
		if p := c.Check(s); len(p) > 0 {
			return fmt.Errorf("%s: %v", file, p)
		}
		fmt.Printf("%s  %s  %s (checked: entrypoint, user, label, files)\n", file, s.Ref, d)
	}
	return nil
}
