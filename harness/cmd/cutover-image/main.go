// cutover-image builds the release images as OCI image layout tarballs
// (harness/image) without a registry or a container engine, one per image,
// each holding linux/amd64 and linux/arm64, then reads each back and checks
// it, every architecture:
//
//	<out>/cutover-agent-<version>.tar        <repo>/cutover-agent:<version>
//	<out>/cutover-coordinator-<version>.tar  <repo>/cutover-coordinator:<version>
//	<out>/cutover-pause-<version>.tar        <repo>/cutover-pause:<version>
//	<out>/images.txt                         "<file> <ref> <repo>@<index digest>" per image
//
// The static binaries come from <bin>/linux-<arch>/ (make images builds
// them); the agent's Debian root from <debs>/<arch>/packages.txt and the
// .deb files beside it (hack/agent-debs.sh, make agent-debs).
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/cutover-dev/cutover/harness/image"
)

func main() {
	fs := pflag.NewFlagSet("cutover-image", pflag.ExitOnError)
	version := fs.String("version", "", "the build's VERSION (image tag and "+image.VersionLabel+" label)")
	bin := fs.String("bin", "bin", "directory holding linux-<arch>/ with the static agent, coordinator, coordctl and cutover-pause")
	debs := fs.String("debs", "", "directory holding <arch>/packages.txt of hack/agent-debs.sh (default: the per-machine cache)")
	out := fs.String("out", "bin/release", "directory the tarballs are written to")
	repo := fs.String("repo", "ghcr.io/cutover-dev", "image repository prefix (as in deploy/base/kustomization.yaml)")
	arches := fs.StringSlice("arch", image.Arches, "architectures (GOARCH) each image holds")
	_ = fs.Parse(os.Args[1:])
	if *debs == "" {
		*debs = defaultDebs()
	}
	if err := run(*version, *bin, *debs, *out, *repo, *arches); err != nil {
		fmt.Fprintln(os.Stderr, "cutover-image:", err)
		os.Exit(1)
	}
}

// defaultDebs is hack/agent-debs.sh's cache directory.
func defaultDebs() string {
	if d := os.Getenv("CUTOVER_CACHE_DIR"); d != "" {
		return filepath.Join(d, "debs")
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(d, "cutover", "debs")
}

func run(version, bin, debs, out, repo string, arches []string) error {
	if version == "" {
		return fmt.Errorf("--version: empty")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	specs := map[string]func(ref, arch string) image.Spec{
		"cutover-agent": func(ref, arch string) image.Spec {
			return image.Agent(ref, version, arch, filepath.Join(bin, "linux-"+arch), filepath.Join(debs, arch, "packages.txt"))
		},
		"cutover-coordinator": func(ref, arch string) image.Spec {
			return image.Coordinator(ref, version, arch, filepath.Join(bin, "linux-"+arch))
		},
		"cutover-pause": func(ref, arch string) image.Spec {
			return image.Pause(ref, version, arch, filepath.Join(bin, "linux-"+arch))
		},
	}
	var list []string
	for _, n := range []string{"cutover-agent", "cutover-coordinator", "cutover-pause"} {
		ref := repo + "/" + n + ":" + version
		file := filepath.Join(out, n+"-"+version+".tar")
		var imgs []v1.Image
		for _, a := range arches {
			img, err := image.Image(specs[n](ref, a))
			if err != nil {
				return fmt.Errorf("%s linux/%s: %w", n, a, err)
			}
			imgs = append(imgs, img)
		}
		d, err := image.WriteOCI(file, ref, imgs...)
		if err != nil {
			return err
		}
		for _, a := range arches {
			c, err := image.Inspect(file, a)
			if err != nil {
				return err
			}
			if p := c.Check(specs[n](ref, a)); len(p) > 0 {
				return fmt.Errorf("%s:\n  %s", file, strings.Join(p, "\n  "))
			}
		}
		fmt.Printf("%s  %s  %s (linux/%s; checked: config, files, tools)\n", file, ref, d, strings.Join(arches, ", linux/"))
		list = append(list, fmt.Sprintf("%s %s %s@%s", filepath.Base(file), ref, repo+"/"+n, d))
	}
	return os.WriteFile(filepath.Join(out, "images.txt"), []byte(strings.Join(list, "\n")+"\n"), 0o644)
}
