package ovs

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// Fake is an in-memory Driver for unit tests of the logic above the driver.
// It applies the same rules as Client (planDstPort, the duplicate-tunnel
// guard, port failures) and dumps its state as canonical text.
type Fake struct {
	mu     sync.Mutex
	ifaces map[string]Interface
	bridge map[string]string // name -> the bridge its port is on, if any
	fail   map[string]string // name -> error ovs-vswitchd reports for it
	writes int
	down   error // set: every call fails, the database is unreachable
}

var _ Driver = (*Fake)(nil)

// NewFake returns a Fake holding ifaces.
func NewFake(ifaces ...Interface) *Fake {
	f := &Fake{ifaces: map[string]Interface{}, bridge: map[string]string{}, fail: map[string]string{}}
	for _, i := range ifaces {
		f.Set(i)
	}
	return f
}

// Set creates or replaces an interface, as another controller (or ovs-vsctl)
// would; it stays on the bridge it was on, if any. A zero OFPort is filled
// in as ovs-vswitchd would: OFPortRequest when free, else the lowest free
// number.
func (f *Fake) Set(i Interface) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set(i)
}

func (f *Fake) set(i Interface) {
	i.Options = copyOptions(i.Options)
	delete(f.ifaces, i.Name)
	if i.OFPort == 0 {
		i.OFPort = f.nextOFPort(i.OFPortRequest)
	}
	f.ifaces[i.Name] = i
}

// SetPort is Set with the interface in a port of its name on bridge.
func (f *Fake) SetPort(bridge string, i Interface) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set(i)
	f.bridge[i.Name] = bridge
}

// Delete removes an interface (and its port).
func (f *Fake) Delete(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.ifaces, name)
	delete(f.bridge, name)
}

// FailPort makes "ovs-vswitchd" fail the interface with reason from its next
// reconfiguration on (ofport -1, error reason); an empty reason heals it.
func (f *Fake) FailPort(name, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if reason == "" {
		delete(f.fail, name)
		return
	}
	f.fail[name] = reason
}

// Writes counts committed write transactions (no-ops do not write).
func (f *Fake) Writes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writes
}

// Dump returns one canonical line per interface, sorted by name, ending in
// bridge=<name> for one on a bridge.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.ifaces))
	for n := range f.ifaces {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		b.WriteString(f.ifaces[n].String())
		if br := f.bridge[n]; br != "" {
			b.WriteString(" bridge=" + br)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// Ping implements Driver.
func (f *Fake) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.down
}

// GetInterface implements Driver.
func (f *Fake) GetInterface(ctx context.Context, name string) (Interface, error) {
	if err := f.Ping(ctx); err != nil {
		return Interface{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	i, ok := f.ifaces[name]
	if !ok {
		return Interface{}, &NotFoundError{Name: name}
	}
	i.Options = copyOptions(i.Options)
	return i, nil
}

// SetDstPort implements Driver.
func (f *Fake) SetDstPort(ctx context.Context, name string, from, to uint16) (Interface, error) {
	if err := f.Ping(ctx); err != nil {
		return Interface{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, ok := f.ifaces[name]
	if !ok {
		return Interface{}, &NotFoundError{Name: name}
	}
	cur.Options = copyOptions(cur.Options)
	options, noop, err := planDstPort(cur, from, to)
	if err != nil {
		return cur, err
	}
	if !noop {
		want := cur
		want.Options = options
		for _, o := range f.ifaces {
			if o.Name != name && sameTunnelPort(o, want) {
				return cur, &PortError{Iface: cur, Reason: fmt.Sprintf("dst_port %d would give it the same tunnel configuration as interface %s (ovs-vswitchd would not tell them apart)", to, o.Name)}
			}
		}
		cur.Options = options
		f.writes++
		f.reconfigure(&cur)
		f.ifaces[name] = cur
	}
	got := cur
	got.Options = copyOptions(cur.Options)
	return got, portFailure(got)
}

// reconfigure plays ovs-vswitchd applying the row.
func (f *Fake) reconfigure(i *Interface) {
	if reason, bad := f.fail[i.Name]; bad {
		i.OFPort, i.Error = -1, reason
		return
	}
	if i.OFPort <= 0 {
		i.OFPort = f.nextOFPort(i.OFPortRequest)
	}
	i.Error = ""
}

// nextOFPort is the number ovs-vswitchd gives an interface: the one it
// requests if no other has it, else the lowest free one.
func (f *Fake) nextOFPort(request int64) int64 {
	used := map[int64]bool{}
	for _, i := range f.ifaces {
		used[i.OFPort] = true
	}
	if request > 0 && !used[request] {
		return request
	}
	n := int64(1)
	for used[n] {
		n++
	}
	return n
}

func copyOptions(o map[string]string) map[string]string {
	out := make(map[string]string, len(o))
	for k, v := range o {
		out[k] = v
	}
	return out
}

// errUnreachable is a convenience for tests: a database that is down.
var errUnreachable = errors.New("ovs: fake: database unreachable")

// Unreachable makes every call fail as if ovsdb-server were down (on=false
// restores it).
func (f *Fake) Unreachable(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if on {
		f.down = errUnreachable
	} else {
		f.down = nil
	}
}

// PrepareDstPort implements Driver: it checks as SetDstPort does and
// remembers the options it read; Apply is a compare-and-set against them,
// as Client's prepared transaction is.
func (f *Fake) PrepareDstPort(ctx context.Context, name string, from, to uint16) (PreparedChange, error) {
	cur, err := f.GetInterface(ctx, name)
	p := &fakePrepared{f: f, name: name, from: from, to: to, cur: cur}
	if err != nil {
		return p, err
	}
	if _, _, err := planDstPort(cur, from, to); err != nil {
		return p, err
	}
	return p, nil
}

type fakePrepared struct {
	f             *Fake
	name          string
	from, to      uint16
	cur           Interface
	used, closed  bool
	sent, applied time.Time
}

func (p *fakePrepared) Timing() (sent, confirmed time.Time) { return p.sent, p.applied }

func (p *fakePrepared) Current() Interface { return p.cur }

func (p *fakePrepared) Close() { p.closed = true }

func (p *fakePrepared) Apply(ctx context.Context) (Interface, error) {
	if p.used || p.closed {
		return p.cur, fmt.Errorf("ovs: prepared change of %s %d -> %d: already applied or closed", p.name, p.from, p.to)
	}
	p.used = true
	now, err := p.f.GetInterface(ctx, p.name)
	if err != nil {
		return p.cur, err
	}
	if now.Type != p.cur.Type || optionsString(now.Options) != optionsString(p.cur.Options) {
		return p.cur, &ConflictError{Name: p.name, Expected: p.from, Current: "options " + optionsString(now.Options)}
	}
	sent := time.Now()
	got, err := p.f.SetDstPort(ctx, p.name, p.from, p.to)
	if port, _ := p.cur.DstPort(); err == nil && port != p.to {
		p.sent, p.applied = sent, time.Now()
	}
	return got, err
}

// Interfaces implements Driver.
func (f *Fake) Interfaces(ctx context.Context, bridge string) ([]Interface, error) {
	if err := f.Ping(ctx); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Interface
	for n, br := range f.bridge {
		if br == bridge {
			i := f.ifaces[n]
			i.Options = copyOptions(i.Options)
			out = append(out, i)
		}
	}
	if len(out) == 0 {
		// A bridge always has its own internal port: none, no bridge.
		return nil, &NotFoundError{Name: bridge, Kind: "bridge"}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// ChangePorts implements Driver: every part is checked before any applies,
// as Client's one transaction does.
func (f *Fake) ChangePorts(ctx context.Context, c PortsChange) error {
	if err := f.Ping(ctx); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	onBridge := false
	for _, br := range f.bridge {
		onBridge = onBridge || br == c.Bridge
	}
	if !onBridge {
		return &NotFoundError{Name: c.Bridge, Kind: "bridge"}
	}
	for _, a := range c.Add {
		if _, ok := f.ifaces[a.Name]; ok && f.bridge[a.Name] != c.Bridge {
			return fmt.Errorf("ovs: add port %s to %s: a port or interface of that name is elsewhere (another bridge, another port); remove it first", a.Name, c.Bridge)
		}
	}
	moves := map[string]map[string]string{}
	for _, m := range c.Move {
		cur, ok := f.ifaces[m.Name]
		if !ok {
			return &NotFoundError{Name: m.Name}
		}
		options, noop, err := planDstPort(cur, m.From, m.To)
		if err != nil {
			return err
		}
		if !noop {
			moves[m.Name] = options
		}
	}
	wrote := len(moves) > 0
	for _, a := range c.Add {
		i, ok := f.ifaces[a.Name]
		if !ok {
			i = Interface{Name: a.Name}
		}
		i.Type, i.Options, i.OFPortRequest = a.Type, copyOptions(a.Options), a.OFPortRequest
		f.reconfigure(&i)
		f.ifaces[a.Name], f.bridge[a.Name] = i, c.Bridge
		wrote = true
	}
	for name, options := range moves {
		i := f.ifaces[name]
		i.Options = options
		f.reconfigure(&i)
		f.ifaces[name] = i
	}
	for _, d := range c.Del {
		if f.bridge[d] == c.Bridge {
			delete(f.ifaces, d)
			delete(f.bridge, d)
			wrote = true
		}
	}
	if wrote {
		f.writes++
	}
	return nil
}
