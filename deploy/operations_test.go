package deploy_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/coordinator/cli"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// images returns every container image of the rendered workloads.
func images(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		for _, c := range cs {
			out = append(out, c.(map[string]any)["image"].(string))
		}
	}
	return out
}

// badTags returns the images without a versioned tag.
func badTags(imgs []string) []string {
	var bad []string
	for _, i := range imgs {
		name := i[strings.LastIndex(i, "/")+1:]
		_, tag, ok := strings.Cut(name, ":")
		if !ok || tag == "latest" || tag == "" {
			bad = append(bad, i)
		}
	}
	return bad
}

// Every rendered image has a versioned tag, never :latest or
// none (with IfNotPresent, nodes would run whatever they pulled once).
func TestImagesVersioned(t *testing.T) {
	for _, k := range kustomizations {
		imgs := images(render(t, k))
		if len(imgs) < 2 {
			t.Fatalf("%s: %d images rendered", k, len(imgs))
		}
		if bad := badTags(imgs); len(bad) > 0 {
			t.Errorf("%s: images without a versioned tag: %v", k, bad)
		}
	}
	if bad := badTags([]string{"ghcr.io/x/a:latest", "ghcr.io/x/b", "localhost:5000/c", "ghcr.io/x/d:v1.2.3"}); len(bad) != 3 {
		t.Errorf("tag check: %v", bad)
	}
}

// `kubectl port-forward` and `kubectl exec ... coordctl` reach
// the coordinator on loopback, and the admin Secret, mounted in the
// coordinator's pod, is a directory coordctl's --tls-dir reads.
func TestCoordctlReachesCoordinator(t *testing.T) {
	objs := render(t, "overlays/full")
	var d appsv1.Deployment
	find(t, objs, "Deployment", "cutover-coordinator", &d)
	c := d.Spec.Template.Spec.Containers[0]
	var listen string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--listen="); ok {
			listen = v
		}
	}
	if !strings.Contains(","+listen+",", ","+cli.DefaultCoordinator+",") {
		t.Errorf("coordinator --listen=%s: want %s among the addresses (coordctl's default; port-forward and exec dial loopback)", listen, cli.DefaultCoordinator)
	}
	// The Secret cert-manager writes for coordctl is the one the pod mounts.
	var admin unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Certificate" && o.GetName() == "cutover-admin" {
			admin = *o
		}
	}
	secret, _, _ := unstructured.NestedString(admin.Object, "spec", "secretName")
	var vol *corev1.Volume
	for i, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil && v.Secret.SecretName == secret && secret != "" {
			vol = &d.Spec.Template.Spec.Volumes[i]
		}
	}
	if vol == nil {
		t.Fatalf("coordinator pod mounts no volume of the admin Secret %q", secret)
	}
	if vol.Secret.Optional == nil || !*vol.Secret.Optional {
		t.Error("admin Secret volume must be optional: without cert-manager there may be none")
	}
	if vol.Secret.Items != nil {
		t.Errorf("admin Secret volume remaps keys %v: --tls-dir expects the Secret's own key names", vol.Secret.Items)
	}
	// cert-manager's keys of a Certificate's Secret (cert-manager.io docs,
	// "Certificate resources": tls.crt, tls.key, ca.crt), as the kubelet
	// projects them: one file each.
	dir := t.TempDir()
	for _, k := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if err := os.WriteFile(filepath.Join(dir, k), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f, err := cli.TLSDirFiles(dir)
	if err != nil {
		t.Fatalf("--tls-dir on the admin Secret's files: %v", err)
	}
	if filepath.Base(f.CA) != "ca.crt" || filepath.Base(f.Cert) != "tls.crt" || filepath.Base(f.Key) != "tls.key" {
		t.Errorf("--tls-dir on the admin Secret's files: %+v", f)
	}
	// docs/deploy.md gives the commands with these paths.
	doc, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	var mount string
	for _, m := range c.VolumeMounts {
		if m.Name == vol.Name {
			mount = m.MountPath
		}
	}
	for _, want := range []string{"kubectl -n cutover port-forward", "--tls-dir " + mount, "--tls-dir"} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("docs/deploy.md does not give %q", want)
		}
	}
}

// Every alert carries runbook_url to a section of docs/runbook.md that
// exists (GitHub's anchor of a heading: lower case, spaces to dashes).
func TestAlertsHaveRunbooks(t *testing.T) {
	b, err := os.ReadFile("../docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(b), -1) {
		a := strings.ToLower(strings.TrimSpace(m[1]))
		a = regexp.MustCompile(`[^a-z0-9 _-]`).ReplaceAllString(a, "")
		anchors[strings.ReplaceAll(a, " ", "-")] = true
	}
	const base = "https://github.com/cutover-dev/cutover/blob/main/docs/runbook.md#"
	n := 0
	for _, o := range render(t, "overlays/full") {
		if o.GetKind() != "PrometheusRule" {
			continue
		}
		groups, _, _ := unstructured.NestedSlice(o.Object, "spec", "groups")
		for _, g := range groups {
			rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
			for _, r := range rules {
				rm := r.(map[string]any)
				name, _ := rm["alert"].(string)
				url, _, _ := unstructured.NestedString(rm, "annotations", "runbook_url")
				n++
				anchor, ok := strings.CutPrefix(url, base)
				switch {
				case !ok:
					t.Errorf("alert %s: runbook_url %q, want %s<section>", name, url, base)
				case !anchors[anchor]:
					t.Errorf("alert %s: docs/runbook.md has no section #%s", name, anchor)
				}
			}
		}
	}
	if n < 8 {
		t.Fatalf("%d alerts found", n)
	}
	for _, code := range []string{"0", "1", "2", "3", "4", "5", "6", "7"} {
		found := false
		for a := range anchors {
			found = found || a == "exit-"+code || strings.HasPrefix(a, "exit-"+code+"-")
		}
		if !found {
			t.Errorf("docs/runbook.md has no section for coordctl exit code %s (heading \"Exit %s ...\")", code, code)
		}
	}
	if !anchors["cutoveroperationfailed"] {
		t.Error("docs/runbook.md has no CutoverOperationFailed section")
	}
}
