package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/cutover-dev/cutover/pkg/tunnelport"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// SourceOfTruth is the configuration the CNI reads its VXLAN port from.
// After a cutover it must say the new port, or the CNI moves the nodes
// back at its next restart; after a rollback, the old one again.
type SourceOfTruth interface {
	// Describe says where the port is configured and what it says now,
	// e.g. "flannel ConfigMap kube-flannel/kube-flannel-cfg has
	// Backend.Port 8472".
	Describe(ctx context.Context) (current string, err error)
	// Port is the port it configures now (the CNI's default when unset).
	// Preflight compares it with the agents' read-back.
	Port(ctx context.Context) (tunnelport.Port, error)
	// Update sets the new port (right before the commit).
	Update(ctx context.Context, port tunnelport.Port) error
	// Restore sets the old port back when an operation that updated it
	// is aborted or rolled back.
	Restore(ctx context.Context, port tunnelport.Port) error
}

// CheckSourceOfTruth is the preflight check: the source of truth must say
// the port the agents read back now. It returns the sentence to show
// either way, and an error when they differ.
func CheckSourceOfTruth(ctx context.Context, s SourceOfTruth, current tunnelport.Port) (string, error) {
	desc, err := s.Describe(ctx)
	if err != nil {
		return "", err
	}
	p, err := s.Port(ctx)
	if err != nil {
		return "", err
	}
	if p != current {
		return "", fmt.Errorf("%s but the agents read back port %d: the CNI would move the nodes to %d at its next restart; make the two agree before a cutover", desc, current, p)
	}
	return fmt.Sprintf("%s which matches the current port", desc), nil
}

// FlannelDefaultPort is flannel's VXLAN port when Backend.Port is unset.
const FlannelDefaultPort = 8472

// Flannel is flannel's kube-flannel-cfg ConfigMap, key net-conf.json.
type Flannel struct {
	Client    kubernetes.Interface
	Namespace string // kube-flannel (current manifests) or kube-system (older)
	Name      string // kube-flannel-cfg
	Key       string // net-conf.json
	DaemonSet string // kube-flannel-ds: the DaemonSet running flanneld
}

// NewFlannel returns flannel's source of truth with the usual names.
func NewFlannel(client kubernetes.Interface, namespace string) *Flannel {
	return &Flannel{Client: client, Namespace: namespace, Name: "kube-flannel-cfg", Key: "net-conf.json", DaemonSet: "kube-flannel-ds"}
}

// RestartStep is the admin's command that restarts every flanneld, one
// node at a time (the DaemonSet's rolling update), so that each reads
// port from net-conf.json.
func (f *Flannel) RestartStep(port tunnelport.Port) string {
	// The command on a line of its own: the CLI prints it unbroken.
	return fmt.Sprintf("restart flanneld one node at a time so that it reads Backend.Port %d (it keeps the port it read at start, and a flannel.1 it recreates would get that one):\n"+
		"kubectl -n %s rollout restart daemonset/%s && kubectl -n %s rollout status daemonset/%s",
		port, f.Namespace, f.DaemonSet, f.Namespace, f.DaemonSet)
}

func (f *Flannel) where() string {
	return fmt.Sprintf("flannel ConfigMap %s/%s", f.Namespace, f.Name)
}

func (f *Flannel) read(ctx context.Context) (string, error) {
	cm, err := f.Client.CoreV1().ConfigMaps(f.Namespace).Get(ctx, f.Name, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("%s: %w", f.where(), err)
	}
	s, ok := cm.Data[f.Key]
	if !ok {
		return "", fmt.Errorf("%s has no key %s", f.where(), f.Key)
	}
	return s, nil
}

// Describe implements SourceOfTruth.
func (f *Flannel) Describe(ctx context.Context) (string, error) {
	s, err := f.read(ctx)
	if err != nil {
		return "", err
	}
	p, set, err := FlannelPort(s)
	if err != nil {
		return "", fmt.Errorf("%s key %s: %w", f.where(), f.Key, err)
	}
	if !set {
		return fmt.Sprintf("%s has no Backend.Port (flannel's default %d)", f.where(), p), nil
	}
	return fmt.Sprintf("%s has Backend.Port %d", f.where(), p), nil
}

// Port implements SourceOfTruth.
func (f *Flannel) Port(ctx context.Context) (tunnelport.Port, error) {
	s, err := f.read(ctx)
	if err != nil {
		return 0, err
	}
	p, _, err := FlannelPort(s)
	if err != nil {
		return 0, fmt.Errorf("%s key %s: %w", f.where(), f.Key, err)
	}
	return p, nil
}

// Update implements SourceOfTruth.
func (f *Flannel) Update(ctx context.Context, port tunnelport.Port) error { return f.set(ctx, port) }

// Restore implements SourceOfTruth. The port is written explicitly even
// when it is flannel's default: same meaning, and no guessing whether the
// field was there before.
func (f *Flannel) Restore(ctx context.Context, port tunnelport.Port) error { return f.set(ctx, port) }

func (f *Flannel) set(ctx context.Context, port tunnelport.Port) error {
	if _, err := tunnelport.From("port", int64(port)); err != nil {
		return fmt.Errorf("%s: %w", f.where(), err)
	}
	cms := f.Client.CoreV1().ConfigMaps(f.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, f.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s, ok := cm.Data[f.Key]
		if !ok {
			return fmt.Errorf("has no key %s", f.Key)
		}
		out, err := SetFlannelPort(s, port)
		if err != nil {
			return fmt.Errorf("key %s: %w", f.Key, err)
		}
		if out == s {
			return nil
		}
		cm.Data[f.Key] = out
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: set Backend.Port %d: %w", f.where(), port, err)
	}
	return nil
}

// flannelDoc locates what SetFlannelPort edits in net-conf.json, as byte
// offsets into the text.
type flannelDoc struct {
	port         tunnelport.Port
	portSet      bool
	portStart    int // the Port value's bytes
	portEnd      int
	backendOpen  int // offset just after Backend's '{'
	backendClose int // offset of Backend's '}'
	lastEnd      int // end of Backend's last member value; -1 when empty
	typ          string
}

// scanFlannel walks the JSON once with the tokenizer, keeping offsets so
// the edit can be done on the text: re-marshalling would reorder keys and
// lose the operator's formatting.
func scanFlannel(s string) (flannelDoc, error) {
	d := flannelDoc{backendOpen: -1, lastEnd: -1}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return d, fmt.Errorf("not a JSON object: %v", orTok(err, tok))
	}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return d, fmt.Errorf("bad JSON: %w", err)
		}
		if k != "Backend" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return d, fmt.Errorf("bad JSON at %v: %w", k, err)
			}
			continue
		}
		tok, err := dec.Token()
		if err != nil {
			return d, fmt.Errorf("bad JSON: %w", err)
		}
		if tok != json.Delim('{') {
			return d, fmt.Errorf("the Backend field is %v, not an object", tok)
		}
		d.backendOpen = int(dec.InputOffset())
		for dec.More() {
			bk, err := dec.Token()
			if err != nil {
				return d, fmt.Errorf("bad JSON in Backend: %w", err)
			}
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return d, fmt.Errorf("bad JSON at Backend.%v: %w", bk, err)
			}
			end := int(dec.InputOffset())
			d.lastEnd = end
			switch bk {
			case "Port":
				var n json.Number
				if err := json.Unmarshal(raw, &n); err != nil || raw[0] == '"' {
					return d, fmt.Errorf("Backend.Port %s: not a number", raw)
				}
				v, err := strconv.ParseUint(n.String(), 10, 16)
				if err != nil || v == 0 {
					return d, fmt.Errorf("Backend.Port %s: want an integer 1–65535", n)
				}
				d.port, d.portSet, d.portEnd, d.portStart = tunnelport.Port(v), true, end, end-len(raw)
			case "Type":
				_ = json.Unmarshal(raw, &d.typ)
			}
		}
		if _, err := dec.Token(); err != nil { // Backend's '}'
			return d, fmt.Errorf("bad JSON in Backend: %w", err)
		}
		d.backendClose = int(dec.InputOffset()) - 1
	}
	if _, err := dec.Token(); err != nil {
		return d, fmt.Errorf("bad JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return d, errors.New("bad JSON: text after the object")
	}
	if d.backendOpen < 0 {
		return d, errors.New("no Backend object")
	}
	if !strings.EqualFold(d.typ, "vxlan") {
		return d, fmt.Errorf("Backend.Type is %q, not \"vxlan\": this flannel does not use a VXLAN port", d.typ)
	}
	if !d.portSet {
		d.port = FlannelDefaultPort
	}
	return d, nil
}

func orTok(err error, tok json.Token) any {
	if err != nil {
		return err
	}
	return tok
}

// FlannelPort reads Backend.Port from net-conf.json; set is false when
// the field is absent (flannel then uses 8472).
func FlannelPort(netConf string) (port tunnelport.Port, set bool, err error) {
	d, err := scanFlannel(netConf)
	if err != nil {
		return 0, false, err
	}
	return d.port, d.portSet, nil
}

// SetFlannelPort returns netConf with Backend.Port = port, every other
// byte as it was: the value is replaced in place, or, when absent, added
// as Backend's last member in the style (one line or indented) of the
// members before it.
func SetFlannelPort(netConf string, port tunnelport.Port) (string, error) {
	d, err := scanFlannel(netConf)
	if err != nil {
		return "", err
	}
	p := strconv.Itoa(int(port))
	if d.portSet {
		return netConf[:d.portStart] + p + netConf[d.portEnd:], nil
	}
	var ins string
	inner := netConf[d.backendOpen:d.backendClose]
	switch {
	case d.lastEnd < 0 && strings.TrimSpace(inner) == "":
		ins, d.lastEnd = `"Port": `+p, d.backendOpen
		if strings.Contains(inner, "\n") {
			ins = "\n" + indentOf(netConf, d.backendOpen) + "  " + ins
		}
	case strings.Contains(netConf[d.backendOpen:d.lastEnd], "\n"):
		first := d.backendOpen + len(inner) - len(strings.TrimLeft(inner, " \t\r\n"))
		ins = ",\n" + indentOf(netConf, first) + `"Port": ` + p
	default:
		ins = `, "Port": ` + p
	}
	var b bytes.Buffer
	b.WriteString(netConf[:d.lastEnd])
	b.WriteString(ins)
	b.WriteString(netConf[d.lastEnd:])
	return b.String(), nil
}

// indentOf is the leading whitespace of the line holding offset i.
func indentOf(s string, i int) string {
	start := strings.LastIndexByte(s[:i], '\n') + 1
	j := start
	for j < len(s) && (s[j] == ' ' || s[j] == '\t') {
		j++
	}
	return s[start:j]
}

// CalicoDefaultPort is Calico's VXLAN port when vxlanPort is unset.
const CalicoDefaultPort = 4789

// FelixConfigurations is the GVR of Calico's FelixConfiguration CRD.
var FelixConfigurations = schema.GroupVersionResource{Group: "crd.projectcalico.org", Version: "v1", Resource: "felixconfigurations"}

// Calico is Calico's cluster-wide FelixConfiguration (named "default"),
// field spec.vxlanPort.
type Calico struct {
	Client dynamic.Interface
	Name   string // "default"
}

// NewCalico returns Calico's source of truth.
func NewCalico(client dynamic.Interface) *Calico { return &Calico{Client: client, Name: "default"} }

func (c *Calico) where() string { return "Calico FelixConfiguration " + c.Name }

func (c *Calico) get(ctx context.Context) (*unstructured.Unstructured, tunnelport.Port, bool, error) {
	u, err := c.Client.Resource(FelixConfigurations).Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, 0, false, fmt.Errorf("%s: not found (is Calico installed with the Kubernetes datastore?): %w", c.where(), err)
		}
		return nil, 0, false, fmt.Errorf("%s: %w", c.where(), err)
	}
	v, found, err := unstructured.NestedFieldNoCopy(u.Object, "spec", "vxlanPort")
	if err != nil || !found || v == nil {
		return u, CalicoDefaultPort, false, nil
	}
	var n int64
	switch x := v.(type) {
	case int64:
		n = x
	case float64:
		n = int64(x)
		if float64(n) != x {
			n = -1
		}
	default:
		n = -1
	}
	p, err := tunnelport.From("spec.vxlanPort", n)
	if err != nil {
		return nil, 0, false, fmt.Errorf("%s: %w", c.where(), err)
	}
	return u, p, true, nil
}

// Describe implements SourceOfTruth.
func (c *Calico) Describe(ctx context.Context) (string, error) {
	_, p, set, err := c.get(ctx)
	if err != nil {
		return "", err
	}
	if !set {
		return fmt.Sprintf("%s has no spec.vxlanPort (Calico's default %d)", c.where(), p), nil
	}
	return fmt.Sprintf("%s has spec.vxlanPort %d", c.where(), p), nil
}

// Port implements SourceOfTruth.
func (c *Calico) Port(ctx context.Context) (tunnelport.Port, error) {
	_, p, _, err := c.get(ctx)
	return p, err
}

// Update implements SourceOfTruth.
func (c *Calico) Update(ctx context.Context, port tunnelport.Port) error { return c.set(ctx, port) }

// Restore implements SourceOfTruth.
func (c *Calico) Restore(ctx context.Context, port tunnelport.Port) error { return c.set(ctx, port) }

func (c *Calico) set(ctx context.Context, port tunnelport.Port) error {
	if _, err := tunnelport.From("port", int64(port)); err != nil {
		return fmt.Errorf("%s: %w", c.where(), err)
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		u, cur, set, err := c.get(ctx)
		if err != nil {
			return err
		}
		if set && cur == port {
			return nil
		}
		if err := unstructured.SetNestedField(u.Object, int64(port), "spec", "vxlanPort"); err != nil {
			return err
		}
		_, err = c.Client.Resource(FelixConfigurations).Update(ctx, u, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: set spec.vxlanPort %d: %w", c.where(), port, err)
	}
	return nil
}
