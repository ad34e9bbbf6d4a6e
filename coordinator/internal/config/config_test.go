package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/spf13/pflag"
)

func TestConfigValidateNamesFlags(t *testing.T) {
	cfg := Default()
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--agent / --inventory") || !strings.Contains(err.Error(), "--tls-ca") {
		t.Errorf("defaults without agents or TLS: %v", err)
	}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	if err := fs.Parse([]string{"--agent", "n1=198.18.0.1:9443", "--agent", "n2=198.18.0.2:9443", "--insecure", "--step-timeout", "10s", "--deadman", "15s"}); err != nil {
		t.Fatal(err)
	}
	err := cfg.Validate()
	if err == nil || !strings.Contains(err.Error(), "--deadman 15s") {
		t.Errorf("short deadman: %v", err)
	}
	cfg.Deadman = Default().Deadman
	if err := cfg.Validate(); err != nil {
		t.Errorf("valid config: %v", err)
	}
	if len(cfg.Agents) != 2 {
		t.Errorf("agents %v", cfg.Agents)
	}
}

func TestInventoryErrors(t *testing.T) {
	for _, tc := range []struct {
		specs []model.AgentSpec
		want  string
	}{
		{[]model.AgentSpec{{Node: "n1", Address: "198.18.0.1:9443"}, {Node: "n1", Address: "198.18.0.2:9443"}}, `node "n1": listed twice`},
		{[]model.AgentSpec{{Node: "n1", Address: "198.18.0.1:9443"}, {Node: "n2", Address: "198.18.0.1:9443"}}, `agent n2 has the same address as agent n1`},
		{[]model.AgentSpec{{Node: "n1", Address: "198.18.0.1"}}, `address "198.18.0.1": agent n1: want host:port`},
		{[]model.AgentSpec{{Node: "n1", Address: "198.18.0.1:99999"}}, `port must be 1–65535`},
		{[]model.AgentSpec{{Node: "bad name", Address: "198.18.0.1:1"}}, `node "bad name"`},
		{nil, "no agents"},
		{[]model.AgentSpec{{Node: "n1", Address: "198.18.0.1:1", Overlay: "Blue!"}}, `overlay "Blue!": agent n1: want an overlay name`},
		{[]model.AgentSpec{{Node: "n1", Address: "198.18.0.1:1", Overlay: "blue", Labels: map[string]string{model.OverlayLabel: "red"}}}, `overlay "blue": agent n1: differs from its label cutover.dev/overlay=red`},
	} {
		_, err := model.NewInventory("test", tc.specs)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !model.IsInventoryError(err) {
			t.Errorf("%v: got %v, want %q", tc.specs, err, tc.want)
		}
	}
	if _, err := model.ParseAgentFlags([]string{"198.18.0.1:9443"}); err == nil || !strings.Contains(err.Error(), "want node=host:port") {
		t.Errorf("flag without node: %v", err)
	}
	specs, err := model.ParseAgentFlags([]string{"n1=198.18.0.1:9443@blue", "n2=[::1]:9443"})
	if err != nil || specs[0].Overlay != "blue" || specs[0].Address != "198.18.0.1:9443" || specs[1].Overlay != "" || specs[1].OverlayName() != model.DefaultOverlay {
		t.Errorf("--agent with overlays: %+v %v", specs, err)
	}
	inv, err := model.NewInventory("test", []model.AgentSpec{{Node: "n1", Address: "198.18.0.1:1", Labels: map[string]string{model.OverlayLabel: "red"}}})
	if err != nil || inv.Agents[0].Overlay != "red" {
		t.Errorf("overlay from the label: %+v %v", inv, err)
	}
	p := filepath.Join(t.TempDir(), "inv.json")
	_ = os.WriteFile(p, []byte(`{"agents":[{"node":"n2","address":"198.18.0.2:9443","labels":{"rack":"b"}},{"node":"n1","address":"198.18.0.1:9443"}]}`), 0o600)
	cfg := Default()
	cfg.InventoryFile = p
	inv, err = cfg.LoadInventory()
	if err != nil || len(inv.Agents) != 2 || inv.Agents[0].Node != "n1" || inv.Agents[1].Labels["rack"] != "b" {
		t.Errorf("file inventory: %v %v", inv, err)
	}
	_ = os.WriteFile(p, []byte(`{"agents":[{"name":"n1"}]}`), 0o600)
	if _, err := cfg.LoadInventory(); err == nil || !strings.Contains(err.Error(), "--inventory") {
		t.Errorf("bad file: %v", err)
	}
}

func TestConfigPathCheckFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--path-check-window", "10ms"}, "--path-check-window 10ms"},
		{[]string{"--path-check-interval", "300ms"}, "--path-check-interval 300ms"},
		{[]string{"--path-check-sample-above", "1"}, "--path-check-sample-above 1"},
		{[]string{"--path-check-peers-k", "0"}, "--path-check-peers-k 0"},
		{[]string{"--clock-good-rtt", "1s"}, "--clock-good-rtt 1s"},
		{[]string{"--clock-good-rtt", "-1ms"}, "--clock-good-rtt -1ms"},
		{[]string{"--clock-parallel", "0"}, "--clock-parallel 0"},
		{[]string{"--clock-parallel", "5000"}, "--clock-parallel 5000"},
		{[]string{"--agent-idle-timeout", "-1s"}, "--agent-idle-timeout -1s"},
	} {
		cfg := Default()
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		cfg.AddFlags(fs)
		if err := fs.Parse(append([]string{"--agent", "n1=198.18.0.1:9443", "--insecure"}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want it to name %q", tc.args, err, tc.want)
		}
	}
	cfg := Default()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	cfg.AddFlags(fs)
	if err := fs.Parse([]string{"--path-check=false"}); err != nil || !cfg.NoPathCheck {
		t.Errorf("--path-check=false: %v, NoPathCheck %v", err, cfg.NoPathCheck)
	}
}
