package model

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// AgentSpec is one agent of the inventory.
type AgentSpec struct {
	Node    string            `json:"node"`
	Address string            `json:"address"` // host:port
	Labels  map[string]string `json:"labels,omitempty"`
	// Overlay names the overlay the node belongs to: nodes of different
	// overlays never exchange overlay traffic, so one overlay may move
	// without the others. Empty: the default overlay. In a file it may also
	// be given as the label OverlayLabel; in a cluster it is that node label.
	Overlay string `json:"overlay,omitempty"`
}

// OverlayLabel is the node label (and inventory label) naming a node's
// overlay; nodes without it belong to the default overlay.
const OverlayLabel = "cutover.dev/overlay"

// DefaultOverlay is how the overlay of nodes with no overlay name is called.
const DefaultOverlay = "default"

// OverlayName is the name of s's overlay, DefaultOverlay when unnamed.
func (s AgentSpec) OverlayName() string {
	if s.Overlay == "" {
		return DefaultOverlay
	}
	return s.Overlay
}

var overlayRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$`)

// Inventory is the set of agents the coordinator knows, sorted by node.
type Inventory struct {
	Agents []AgentSpec `json:"agents"`
}

// InventoryError is a bad inventory entry.
type InventoryError struct {
	Source string // "--agent" or the file name
	Field  string // "node", "address", ...
	Value  string
	Reason string
}

func (e *InventoryError) Error() string {
	return fmt.Sprintf("inventory %s: %s %q: %s", e.Source, e.Field, e.Value, e.Reason)
}

// IsInventoryError reports whether err is (or wraps) an InventoryError.
func IsInventoryError(err error) bool {
	var ie *InventoryError
	return errors.As(err, &ie)
}

var nodeNameRe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$`)

// ParseAgentFlags parses --agent node=host:port[@overlay] values.
func ParseAgentFlags(vals []string) ([]AgentSpec, error) {
	var specs []AgentSpec
	var errs []error
	for _, v := range vals {
		node, addr, ok := strings.Cut(v, "=")
		if !ok {
			errs = append(errs, &InventoryError{Source: "--agent", Field: "value", Value: v, Reason: "want node=host:port[@overlay]"})
			continue
		}
		addr, overlay, _ := strings.Cut(addr, "@")
		specs = append(specs, AgentSpec{Node: node, Address: addr, Overlay: overlay})
	}
	return specs, errors.Join(errs...)
}

// LoadInventoryFile reads a JSON inventory.
func LoadInventoryFile(path string) ([]AgentSpec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--inventory %q: %w", path, err)
	}
	var inv Inventory
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&inv); err != nil {
		return nil, fmt.Errorf("--inventory %q: not a valid inventory (want {\"agents\":[{\"node\":...,\"address\":\"host:port\"}]}): %w", path, err)
	}
	return inv.Agents, nil
}

// NewInventory validates specs (from flags and/or a file) and returns them
// sorted by node. Duplicate node names or addresses and bad host:port are
// InventoryErrors.
func NewInventory(source string, specs []AgentSpec) (Inventory, error) {
	var errs []error
	byNode := map[string]bool{}
	byAddr := map[string]string{}
	for _, s := range specs {
		bad := func(field, value, reason string) {
			errs = append(errs, &InventoryError{Source: source, Field: field, Value: value, Reason: reason})
		}
		if !nodeNameRe.MatchString(s.Node) {
			bad("node", s.Node, "want a node name (letters, digits, '.', '_', '-')")
			continue
		}
		if byNode[s.Node] {
			bad("node", s.Node, "listed twice")
			continue
		}
		byNode[s.Node] = true
		host, port, err := net.SplitHostPort(s.Address)
		if err != nil || host == "" {
			bad("address", s.Address, fmt.Sprintf("agent %s: want host:port", s.Node))
			continue
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			bad("address", s.Address, fmt.Sprintf("agent %s: port must be 1–65535", s.Node))
			continue
		}
		if other, dup := byAddr[s.Address]; dup {
			bad("address", s.Address, fmt.Sprintf("agent %s has the same address as agent %s", s.Node, other))
			continue
		}
		byAddr[s.Address] = s.Node
		for k := range s.Labels {
			if k == "" || strings.ContainsAny(k, "=,") {
				bad("labels", k, fmt.Sprintf("agent %s: label keys must be non-empty without '=' or ','", s.Node))
			}
		}
		if lbl, ok := s.Labels[OverlayLabel]; ok && s.Overlay != "" && lbl != s.Overlay {
			bad("overlay", s.Overlay, fmt.Sprintf("agent %s: differs from its label %s=%s: give the overlay once", s.Node, OverlayLabel, lbl))
		} else if o := cmp.Or(s.Overlay, s.Labels[OverlayLabel]); o != "" && !overlayRe.MatchString(o) {
			bad("overlay", o, fmt.Sprintf("agent %s: want an overlay name (lower-case letters, digits, '.', '-'; at most 63)", s.Node))
		}
	}
	if len(specs) == 0 {
		errs = append(errs, &InventoryError{Source: source, Field: "agents", Value: "", Reason: "no agents"})
	}
	if err := errors.Join(errs...); err != nil {
		return Inventory{}, err
	}
	out := slices.Clone(specs)
	for i := range out {
		out[i].Overlay = cmp.Or(out[i].Overlay, out[i].Labels[OverlayLabel])
	}
	slices.SortFunc(out, func(a, b AgentSpec) int { return strings.Compare(a.Node, b.Node) })
	return Inventory{Agents: out}, nil
}

// NodeNames lists the inventory's nodes in its order (sorted by name).
func (inv Inventory) NodeNames() []string {
	var ns []string
	for _, a := range inv.Agents {
		ns = append(ns, a.Node)
	}
	return ns
}

// InventorySource reads the inventory anew (cluster discovery). The
// coordinator calls it before judging a request, so that a node that
// joined, or whose agent became ready, after the coordinator started is
// part of the next plan.
type InventorySource func(ctx context.Context) (Inventory, error)
