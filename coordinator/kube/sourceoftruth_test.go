package kube

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/pkg/tunnelport"
	"k8s.io/apimachinery/pkg/runtime/schema"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	dynfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
)

// flannel's upstream manifest, as shipped.
const upstreamNetConf = `{
  "Network": "198.19.0.0/16",
  "EnableNFTables": false,
  "Backend": {
    "Type": "vxlan"
  }
}
`

func TestSetFlannelPort(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		port           tunnelport.Port
	}{
		{"absent, indented", upstreamNetConf, `{
  "Network": "198.19.0.0/16",
  "EnableNFTables": false,
  "Backend": {
    "Type": "vxlan",
    "Port": 4889
  }
}
`, 4889},
		{"present, replaced in place", `{"Network":"198.19.0.0/16","Backend":{"Type":"vxlan","Port":8472,"VNI":1},"Zeta":[1,{"Port":1}]}`,
			`{"Network":"198.19.0.0/16","Backend":{"Type":"vxlan","Port":4889,"VNI":1},"Zeta":[1,{"Port":1}]}`, 4889},
		{"absent, one line", `{"Backend": {"Type": "vxlan", "VNI": 4096}, "Network": "198.19.0.0/16"}`,
			`{"Backend": {"Type": "vxlan", "VNI": 4096, "Port": 9000}, "Network": "198.19.0.0/16"}`, 9000},
		{"tabs and a nested last member", "{\n\t\"Backend\": {\n\t\t\"Type\": \"vxlan\",\n\t\t\"X\": {\"a\": [1, 2]}\n\t}\n}",
			"{\n\t\"Backend\": {\n\t\t\"Type\": \"vxlan\",\n\t\t\"X\": {\"a\": [1, 2]},\n\t\t\"Port\": 4889\n\t}\n}", 4889},
		{"Port first, spaced", `{ "Backend" : { "Port" :  4789 , "Type" : "VXLAN" } }`, `{ "Backend" : { "Port" :  4889 , "Type" : "VXLAN" } }`, 4889},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SetFlannelPort(tc.in, tc.port)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", got, tc.want)
			}
			// Every field but Backend.Port is unchanged, semantically too.
			var before, after map[string]any
			if err := json.Unmarshal([]byte(tc.in), &before); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(got), &after); err != nil {
				t.Fatal(err)
			}
			bb, ab := before["Backend"].(map[string]any), after["Backend"].(map[string]any)
			if ab["Port"] != float64(tc.port) {
				t.Errorf("Backend.Port = %v", ab["Port"])
			}
			delete(bb, "Port")
			delete(ab, "Port")
			if !reflect.DeepEqual(before, after) {
				t.Errorf("other fields changed: %v → %v", before, after)
			}
			p, set, err := FlannelPort(got)
			if err != nil || !set || p != tc.port {
				t.Errorf("FlannelPort(result) = %d %t %v", p, set, err)
			}
			// Idempotent.
			again, _ := SetFlannelPort(got, tc.port)
			if again != got {
				t.Errorf("second edit changed the text:\n%s", again)
			}
		})
	}
}

func TestFlannelPortErrors(t *testing.T) {
	for in, want := range map[string]string{
		`{"Backend":{"Type":"host-gw"}}`:             `Backend.Type is "host-gw", not "vxlan"`,
		`{"Network":"198.19.0.0/16"}`:                "no Backend object",
		`{"Backend":"vxlan"}`:                        "the Backend field is vxlan, not an object",
		`{"Backend":{"Type":"vxlan","Port":"8472"}}`: `Backend.Port "8472": not a number`,
		`{"Backend":{"Type":"vxlan","Port":70000}}`:  "Backend.Port 70000: want an integer 1–65535",
		`{"Backend":{"Type":"vxlan","Port":8472.5}}`: "Backend.Port 8472.5: want an integer 1–65535",
		`{"Backend":{"Type":"vxlan"}} {}`:            "text after the object",
		`[1]`:                                        "not a JSON object",
		`{"Backend":{"Type":"vxlan",}}`:              "bad JSON",
	} {
		_, _, err := FlannelPort(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("FlannelPort(%s) = %v, want %q", in, err, want)
		}
	}
	p, set, err := FlannelPort(upstreamNetConf)
	if err != nil || set || p != FlannelDefaultPort {
		t.Errorf("default: %d %t %v", p, set, err)
	}
}

func TestFlannelSourceOfTruth(t *testing.T) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kube-flannel-cfg", Namespace: "kube-flannel"},
		Data: map[string]string{"net-conf.json": upstreamNetConf, "cni-conf.json": `{"name":"cbr0"}`}}
	cs := fake.NewClientset(cm)
	f := NewFlannel(cs, "kube-flannel")
	ctx := context.Background()
	msg, err := CheckSourceOfTruth(ctx, f, 8472)
	if want := "flannel ConfigMap kube-flannel/kube-flannel-cfg has no Backend.Port (flannel's default 8472) which matches the current port"; err != nil || msg != want {
		t.Errorf("check = %q, %v; want %q", msg, err, want)
	}
	if err := f.Update(ctx, 4889); err != nil {
		t.Fatal(err)
	}
	msg, err = CheckSourceOfTruth(ctx, f, 8472)
	if want := "flannel ConfigMap kube-flannel/kube-flannel-cfg has Backend.Port 4889 but the agents read back port 8472"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("check = %q, %v; want %q", msg, err, want)
	}
	got, _ := cs.CoreV1().ConfigMaps("kube-flannel").Get(ctx, "kube-flannel-cfg", metav1.GetOptions{})
	if got.Data["cni-conf.json"] != `{"name":"cbr0"}` || !strings.Contains(got.Data["net-conf.json"], `"Port": 4889`) {
		t.Errorf("ConfigMap after update: %v", got.Data)
	}
	if err := f.Restore(ctx, 8472); err != nil {
		t.Fatal(err)
	}
	if d, _ := f.Describe(ctx); d != "flannel ConfigMap kube-flannel/kube-flannel-cfg has Backend.Port 8472" {
		t.Errorf("describe after restore: %q", d)
	}
	if _, err := NewFlannel(cs, "kube-system").Describe(ctx); err == nil || !strings.Contains(err.Error(), "kube-system/kube-flannel-cfg") {
		t.Errorf("missing ConfigMap: %v", err)
	}
}

func felix(spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "crd.projectcalico.org/v1", "kind": "FelixConfiguration",
		"metadata": map[string]any{"name": "default"}, "spec": spec}}
	return u
}

func TestCalicoSourceOfTruth(t *testing.T) {
	scheme := runtime.NewScheme()
	dc := dynfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		map[schema.GroupVersionResource]string{FelixConfigurations: "FelixConfigurationList"},
		felix(map[string]any{"logSeverityScreen": "Info", "vxlanEnabled": true}))
	c := NewCalico(dc)
	ctx := context.Background()
	msg, err := CheckSourceOfTruth(ctx, c, 4789)
	if want := "Calico FelixConfiguration default has no spec.vxlanPort (Calico's default 4789) which matches the current port"; err != nil || msg != want {
		t.Errorf("check = %q, %v", msg, err)
	}
	if err := c.Update(ctx, 4889); err != nil {
		t.Fatal(err)
	}
	u, _ := dc.Resource(FelixConfigurations).Get(ctx, "default", metav1.GetOptions{})
	spec := u.Object["spec"].(map[string]any)
	if spec["vxlanPort"] != int64(4889) || spec["logSeverityScreen"] != "Info" || spec["vxlanEnabled"] != true {
		t.Errorf("spec after update: %v", spec)
	}
	if d, _ := c.Describe(ctx); d != "Calico FelixConfiguration default has spec.vxlanPort 4889" {
		t.Errorf("describe: %q", d)
	}
	if err := c.Restore(ctx, 4789); err != nil {
		t.Fatal(err)
	}
	if p, _ := c.Port(ctx); p != 4789 {
		t.Errorf("port after restore %d", p)
	}
	if _, err := NewCalico(dynfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{FelixConfigurations: "FelixConfigurationList"})).Port(ctx); err == nil ||
		!strings.Contains(err.Error(), "not found (is Calico installed") {
		t.Errorf("absent: %v", err)
	}
}
