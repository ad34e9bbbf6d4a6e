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
	fail   map[string]string // name -> error ovs-vswitchd reports for it
	writes int
	down   error // set: every call fails, the database is unreachable
}

var _ Driver = (*Fake)(nil)

// NewFake returns a Fake holding ifaces.
func NewFake(ifaces ...Interface) *Fake {
	f := &Fake{ifaces: map[string]Interface{}, fail: map[string]string{}}
	for _, i := range ifaces {
		f.Set(i)
	}
	return f
}

// Set creates or replaces an interface, as another controller (or ovs-vsctl)
// would. A zero OFPort is filled in with the next free number.
func (f *Fake) Set(i Interface) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i.Options = copyOptions(i.Options)
	if i.OFPort == 0 {
		i.OFPort = f.nextOFPort()
	}
	f.ifaces[i.Name] = i
}

// Delete removes an interface.
func (f *Fake) Delete(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.ifaces, name)
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

// Writes counts committed SetDstPort transactions (no-ops do not write).
func (f *Fake) Writes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writes
}

// Dump returns one canonical line per interface, sorted by name.
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
		i.OFPort = f.nextOFPort()
	}
	i.Error = ""
}

func (f *Fake) nextOFPort() int64 {
	var max int64
	for _, i := range f.ifaces {
		if i.OFPort > max && i.OFPort < 65279 { // skip LOCAL (65534) and friends
			max = i.OFPort
		}
	}
	return max + 1
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
