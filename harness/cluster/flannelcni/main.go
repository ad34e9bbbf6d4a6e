// Command flannelcni stands in for flannel's CNI plugin
// (github.com/flannel-io/cni-plugin), which the module proxy refuses, on
// the real-cluster tier. It does what that plugin does for the vxlan
// backend: reads the subnet flanneld wrote (/run/flannel/subnet.env) and
// delegates to the reference bridge plugin with cni0, host-local IPAM over
// FLANNEL_SUBNET, a route to FLANNEL_NETWORK and FLANNEL_MTU, and keeps
// the delegate's configuration per container (under dataDir) so DEL
// undoes what ADD did even after subnet.env changed. It is harness code:
// nothing Cutover ships runs it.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

const (
	defaultSubnetFile = "/run/flannel/subnet.env"
	defaultDataDir    = "/var/lib/cni/flannel"
)

// netConf is the plugin's entry in the network configuration list.
type netConf struct {
	CNIVersion string         `json:"cniVersion"`
	Name       string         `json:"name"`
	SubnetFile string         `json:"subnetFile"`
	DataDir    string         `json:"dataDir"`
	Delegate   map[string]any `json:"delegate"`
}

type cniError struct {
	CNIVersion string `json:"cniVersion"`
	Code       int    `json:"code"`
	Msg        string `json:"msg"`
}

func main() {
	stdin, err := readAll()
	if err == nil {
		err = run(os.Getenv("CNI_COMMAND"), stdin)
	}
	if err != nil {
		_ = json.NewEncoder(os.Stdout).Encode(cniError{CNIVersion: "1.0.0", Code: 999, Msg: "flannel (harness stand-in): " + err.Error()})
		os.Exit(1)
	}
}

func readAll() ([]byte, error) {
	var b bytes.Buffer
	_, err := b.ReadFrom(os.Stdin)
	return b.Bytes(), err
}

func run(cmd string, stdin []byte) error {
	if cmd == "VERSION" {
		fmt.Println(`{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}`)
		return nil
	}
	var nc netConf
	if err := json.Unmarshal(stdin, &nc); err != nil {
		return fmt.Errorf("network configuration: %w", err)
	}
	if nc.SubnetFile == "" {
		nc.SubnetFile = defaultSubnetFile
	}
	if nc.DataDir == "" {
		nc.DataDir = defaultDataDir
	}
	id := os.Getenv("CNI_CONTAINERID")
	if id == "" || strings.ContainsAny(id, "/.") {
		return fmt.Errorf("CNI_CONTAINERID %q: want a container id", id)
	}
	cache := filepath.Join(nc.DataDir, id)
	switch cmd {
	case "ADD":
		conf, err := delegateConf(nc)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(nc.DataDir, 0o700); err != nil {
			return err
		}
		if err := os.WriteFile(cache, conf, 0o600); err != nil {
			return err
		}
		return delegate(conf)
	case "DEL":
		conf, err := os.ReadFile(cache)
		if os.IsNotExist(err) {
			return nil // never added, or already deleted: DEL is idempotent
		}
		if err != nil {
			return err
		}
		if err := delegate(conf); err != nil {
			return err
		}
		return os.Remove(cache)
	case "CHECK":
		conf, err := os.ReadFile(cache)
		if err != nil {
			return err
		}
		return delegate(conf)
	case "STATUS", "GC":
		return nil
	}
	return fmt.Errorf("CNI_COMMAND %q: want ADD, DEL, CHECK or VERSION", cmd)
}

// delegateConf is the bridge plugin's configuration for this node's
// subnet, as flannel's plugin builds it.
func delegateConf(nc netConf) ([]byte, error) {
	env, err := readSubnetEnv(nc.SubnetFile)
	if err != nil {
		return nil, err
	}
	for _, k := range []string{"FLANNEL_NETWORK", "FLANNEL_SUBNET", "FLANNEL_MTU"} {
		if env[k] == "" {
			return nil, fmt.Errorf("%s: %s missing (has flanneld started on this node?)", nc.SubnetFile, k)
		}
	}
	mtu, err := strconv.Atoi(env["FLANNEL_MTU"])
	if err != nil {
		return nil, fmt.Errorf("%s: FLANNEL_MTU %q: %w", nc.SubnetFile, env["FLANNEL_MTU"], err)
	}
	// subnet.env holds the node's gateway address with its length
	// (198.19.2.1/24); host-local wants the network.
	sn, err := netip.ParsePrefix(env["FLANNEL_SUBNET"])
	if err != nil {
		return nil, fmt.Errorf("%s: FLANNEL_SUBNET: %w", nc.SubnetFile, err)
	}
	d := map[string]any{}
	for k, v := range nc.Delegate {
		d[k] = v
	}
	d["cniVersion"] = nc.CNIVersion
	d["name"] = nc.Name
	setDefault(d, "type", "bridge")
	setDefault(d, "bridge", "cni0")
	setDefault(d, "isGateway", true)
	setDefault(d, "mtu", mtu)
	// flanneld masquerades itself when FLANNEL_IPMASQ is true; the bridge
	// must not do it a second time.
	setDefault(d, "ipMasq", env["FLANNEL_IPMASQ"] != "true")
	d["ipam"] = map[string]any{
		"type":   "host-local",
		"ranges": [][]map[string]string{{{"subnet": sn.Masked().String()}}},
		"routes": []map[string]string{{"dst": env["FLANNEL_NETWORK"]}},
	}
	return json.Marshal(d)
}

func setDefault(m map[string]any, k string, v any) {
	if _, ok := m[k]; !ok {
		m[k] = v
	}
}

func readSubnetEnv(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	env := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(s.Text()), "=")
		if ok {
			env[k] = v
		}
	}
	return env, s.Err()
}

// delegate runs the bridge plugin (found on CNI_PATH) with conf and this
// process's CNI environment; its result or error is this plugin's.
func delegate(conf []byte) error {
	var typ struct{ Type string }
	if err := json.Unmarshal(conf, &typ); err != nil {
		return err
	}
	var bin string
	for _, dir := range filepath.SplitList(os.Getenv("CNI_PATH")) {
		if p := filepath.Join(dir, typ.Type); isFile(p) {
			bin = p
			break
		}
	}
	if bin == "" {
		return fmt.Errorf("delegate plugin %q not found on CNI_PATH %q", typ.Type, os.Getenv("CNI_PATH"))
	}
	cmd := exec.Command(bin)
	cmd.Stdin = bytes.NewReader(conf)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			os.Exit(ee.ExitCode()) // the delegate printed its error
		}
		return err
	}
	return nil
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}
