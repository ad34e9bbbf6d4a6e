package main

import (
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/coordinator/openshift"
	"k8s.io/client-go/rest"
)

func TestSDNFlags(t *testing.T) {
	rc := &rest.Config{Host: "https://127.0.0.1:1"}
	for _, tc := range []struct {
		f       sdnFlags
		cluster bool
		want    string // "" = a hook, "off" = nil hook
	}{
		{sdnFlags{}, false, "off"},
		{sdnFlags{image: "r/img:x"}, true, "--openshift-sdn-image"},
		{sdnFlags{strategy: openshift.StrategySourceOfTruthFirst}, false, "needs --kube"},
		{sdnFlags{strategy: "rebuild"}, true, `--openshift-sdn "rebuild"`},
		{sdnFlags{strategy: openshift.StrategyFieldReport}, true, `--openshift-sdn "field-report"`}, // no image
		{sdnFlags{strategy: openshift.StrategySourceOfTruthFirst}, true, ""},
		{sdnFlags{strategy: openshift.StrategyFieldReport, image: "r/ose-node:v3.11-custom"}, true, ""},
	} {
		h, err := tc.f.hook(rc, tc.cluster)
		switch tc.want {
		case "off":
			if err != nil || h != nil {
				t.Errorf("%+v: %v %v, want no hook", tc.f, h, err)
			}
		case "":
			if err != nil || h == nil {
				t.Errorf("%+v: %v %v, want a hook", tc.f, h, err)
			}
		default:
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%+v: %v, want an error naming %s", tc.f, err, tc.want)
			}
		}
	}
}
