package sdnsim

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
)

// Fake is an in-memory Node: one vxlan0 port, table 253, the drop flow's
// port, the SDN chains' ports, and a count of rebuilds. Dump prints it as
// canonical text.
type Fake struct {
	mu       sync.Mutex
	Port     uint16
	Notes    []string
	DropPort uint16
	Allow    map[uint16]bool // OPENSHIFT-FIREWALL-ALLOW ports
	NoTrack  map[uint16]bool // OPENSHIFT-NOTRACK ports
	Rebuilds int
	lost     chan struct{}
}

// NewFake is a node set up by an SDN for port.
func NewFake(port uint16) *Fake {
	return &Fake{Port: port, Notes: []string{"note:" + VersionNote + ".00.00.00.00"}, DropPort: port,
		Allow: map[uint16]bool{port: true}, NoTrack: map[uint16]bool{port: true}, lost: make(chan struct{})}
}

// SetPort moves vxlan0 as another controller (a cutover) would.
func (f *Fake) SetPort(p uint16) { f.mu.Lock(); f.Port = p; f.mu.Unlock() }

// DropConnection makes Lost fire, as an ovsdb-server restart would.
func (f *Fake) DropConnection() { f.mu.Lock(); close(f.lost); f.mu.Unlock() }

// DstPort implements Node.
func (f *Fake) DstPort(context.Context) (uint16, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Port, nil
}

// VersionFlows implements Node.
func (f *Fake) VersionFlows(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.Notes...), nil
}

// Rebuild implements Node.
func (f *Fake) Rebuild(_ context.Context, port uint16) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Port, f.Notes, f.DropPort = port, nil, port
	f.Rebuilds++
	return nil
}

// FinishSetup implements Node.
func (f *Fake) FinishSetup(_ context.Context, note string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Notes = append(f.Notes, "note:"+note)
	return nil
}

// SyncFirewall implements Node with the SDN's flush-when-incomplete rule.
func (f *Fake) SyncFirewall(_ context.Context, port uint16) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range []map[uint16]bool{f.Allow, f.NoTrack} {
		if !m[port] {
			clear(m)
			m[port] = true
		}
	}
	return nil
}

// Lost implements Node.
func (f *Fake) Lost() <-chan struct{} { f.mu.Lock(); defer f.mu.Unlock(); return f.lost }

// Reconnect implements Node.
func (f *Fake) Reconnect(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lost = make(chan struct{})
	return nil
}

// Dump prints the node as canonical text.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	ports := func(m map[uint16]bool) string {
		var s []string
		for p := range m {
			s = append(s, fmt.Sprint(p))
		}
		sort.Strings(s)
		return strings.Join(s, " ")
	}
	return fmt.Sprintf("vxlan0 dst_port=%d\ntable=253 %s\ndrop udp_dst=%d\nOPENSHIFT-FIREWALL-ALLOW %s\nOPENSHIFT-NOTRACK %s\nrebuilds %d\n",
		f.Port, strings.Join(f.Notes, ","), f.DropPort, ports(f.Allow), ports(f.NoTrack), f.Rebuilds)
}
