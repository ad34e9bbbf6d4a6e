package lab_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/agent/operation"
	"github.com/cutover-dev/cutover/harness/lab"
	"github.com/cutover-dev/cutover/pkg/vxlan"
)

// The kernel VXLAN limit runs a process per node, as the agents are: the
// same recreate run from one process, a thread per node, lost 6× what the
// agents did (its windows queued for up to 75 ms), so it bounded nothing.
// Each node's process is this test binary again (TestMain hands it to
// kernelLimitNode when kernelLimitEnv is set), started in the node's
// namespace; it does what the agent does for a kernel commit and nothing
// else: the new device prebuilt and the commit's read armed ahead (pkg/vxlan
// Prebuild and Arm), then at one wall-clock instant given to every node,
// the recreate (RecreateArmed), the old device deleted once measured
// (Cleanup), as the agent deletes it at Finalize. No gRPC, no barrier, no clocks to agree
// on, no read-back: what is left is the kernel's own work on this lab.

// kernelLimitEnv names the device and the ports, "device,from,to", in a
// kernel limit node's environment.
const kernelLimitEnv = "COT_KERNEL_LIMIT_NODE"

// limitMsg is one line of the limit node's conversation with the
// benchmark, JSON both ways: the node says Armed, is sent At (Unix ns),
// answers with its recreate (Began, Done, Window), is sent Cleanup and
// says Clean. Err ends it.
type limitMsg struct {
	Armed   bool   `json:"armed,omitempty"`
	At      int64  `json:"at,omitempty"`
	Began   int64  `json:"began,omitempty"`
	Done    int64  `json:"done,omitempty"`
	Window  int64  `json:"window_ns,omitempty"`
	Cleanup bool   `json:"cleanup,omitempty"`
	Clean   bool   `json:"clean,omitempty"`
	Err     string `json:"err,omitempty"`
}

// kernelLimitNode is a limit node's process (kernelLimitEnv set): it
// speaks limitMsg on stdin and stdout and returns the exit code.
func kernelLimitNode(spec string) int {
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) int {
		_ = out.Encode(limitMsg{Err: err.Error()})
		return 1
	}
	f := strings.Split(spec, ",")
	if len(f) != 3 {
		return fail(fmt.Errorf("%s=%q: want device,from,to", kernelLimitEnv, spec))
	}
	from, err1 := strconv.Atoi(f[1])
	to, err2 := strconv.Atoi(f[2])
	if err := errors.Join(err1, err2); err != nil {
		return fail(fmt.Errorf("%s=%q: %w", kernelLimitEnv, spec, err))
	}
	dev := f[0]
	k, err := vxlan.Open("") // the namespace ip netns exec put it in
	if err != nil {
		return fail(err)
	}
	defer k.Close()
	// As the agent: the old device is deleted after the measurement
	// (Cleanup), not inside the recreate, where its deletion holds the
	// RTNL lock for tens of ms that every other node's window on this
	// shared kernel queues behind.
	k.KeepOld = true
	snap, err := k.Snapshot(dev)
	if err != nil {
		return fail(err)
	}
	if snap.Device.Port != from {
		return fail(fmt.Errorf("%s is on port %d, want %d", dev, snap.Device.Port, from))
	}
	if _, err := k.Prebuild(snap, to); err != nil {
		return fail(fmt.Errorf("prebuild: %w", err))
	}
	armed, err := k.Arm(context.Background(), dev, to)
	if err != nil {
		return fail(fmt.Errorf("arm: %w", err))
	}
	defer armed.Close()
	in := json.NewDecoder(os.Stdin)
	var m limitMsg
	if err := errors.Join(out.Encode(limitMsg{Armed: true}), in.Decode(&m)); err != nil {
		return fail(fmt.Errorf("waiting for the instant: %w", err))
	}
	if m.At == 0 {
		return fail(fmt.Errorf("waiting for the instant: got %+v", m))
	}
	operation.PreciseSleepUntil(time.Unix(0, m.At)) // as the agent wakes for its instant
	began := time.Now()
	w, err := k.RecreateArmed(armed)
	done := time.Now()
	if err != nil {
		return fail(fmt.Errorf("recreate: %w", err))
	}
	if err := errors.Join(out.Encode(limitMsg{Began: began.UnixNano(), Done: done.UnixNano(), Window: int64(w.Total)}), in.Decode(&m)); err != nil {
		return fail(fmt.Errorf("waiting for the cleanup: %w", err))
	}
	if !m.Cleanup {
		return fail(fmt.Errorf("waiting for the cleanup: got %+v", m))
	}
	if err := k.Cleanup(dev); err != nil {
		return fail(fmt.Errorf("cleanup: %w", err))
	}
	_ = out.Encode(limitMsg{Clean: true})
	return 0
}

// limitNode is the benchmark's end of one limit node's process.
type limitNode struct {
	name string
	cmd  *exec.Cmd
	in   *json.Encoder
	out  *json.Decoder
	inW  io.Closer
}

// ask sends m (unless zero) and reads the node's answer, which must not
// be an error.
func (n *limitNode) ask(m *limitMsg) (limitMsg, error) {
	if m != nil {
		if err := n.in.Encode(m); err != nil {
			return limitMsg{}, fmt.Errorf("%s: %w", n.name, err)
		}
	}
	var got limitMsg
	if err := n.out.Decode(&got); err != nil {
		return limitMsg{}, fmt.Errorf("%s: %w", n.name, err)
	}
	if got.Err != "" {
		return got, fmt.Errorf("%s: %s", n.name, got.Err)
	}
	return got, nil
}

// limitKernel is the kernel VXLAN counterpart of limitOVS: a process per
// node (kernelLimitNode), each node's device prebuilt and armed, every
// recreate at one instant. took is each node's window, from the old
// device's deletion to its last entry restored.
func (bl *benchLab) limitKernel(from, to int) (cutoverFigure, []time.Duration) {
	b, ctx, l, nodes := bl.b, bl.ctx, bl.l, bl.nodes
	for _, node := range nodes {
		if err := l.OpenPortDirect(ctx, node, to); err != nil {
			b.Fatal(err)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	procs := make([]*limitNode, len(nodes))
	defer func() {
		for _, p := range procs {
			if p != nil {
				_ = p.inW.Close()
				if err := p.cmd.Wait(); err != nil {
					b.Errorf("limit node %s: %v", p.name, err)
				}
			}
		}
	}()
	for k, node := range nodes {
		cmd, err := l.Command(ctx, node, exe, "-test.run=^$")
		if err != nil {
			b.Fatal(err)
		}
		cmd.Env = append(cmd.Env, fmt.Sprintf("%s=%s,%d,%d", kernelLimitEnv, lab.KernelDevice, from, to))
		cmd.Stderr = os.Stderr
		inW, err := cmd.StdinPipe()
		if err != nil {
			b.Fatal(err)
		}
		outR, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatalf("limit node %s: %v", node, err)
		}
		procs[k] = &limitNode{name: node, cmd: cmd, in: json.NewEncoder(inW), out: json.NewDecoder(bufio.NewReader(outR)), inW: inW}
	}
	for _, p := range procs {
		if _, err := p.ask(nil); err != nil {
			b.Fatalf("limit node: arm: %v", err)
		}
	}
	if _, err := l.ProbeStats(ctx, true); err != nil {
		b.Fatal(err)
	}
	// Far enough ahead that every node has it before it comes: a few
	// writes to pipes, and each process's wake.
	at := time.Now().Add(20 * time.Millisecond)
	began, done := make([]time.Time, len(nodes)), make([]time.Time, len(nodes))
	took := make([]time.Duration, len(nodes))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for k, p := range procs {
		wg.Go(func() {
			got, err := p.ask(&limitMsg{At: at.UnixNano()})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("recreate: %w", err))
				return
			}
			began[k], done[k], took[k] = time.Unix(0, got.Began), time.Unix(0, got.Done), time.Duration(got.Window)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	last := done[0]
	for _, t := range done {
		last = maxT(last, t)
	}
	time.Sleep(bl.settle)
	pairs, err := l.ProbeStats(ctx, false)
	if err != nil {
		b.Fatal(err)
	}
	f := figure(bl.base, "limit", pairs, spreadOf(done), last.Sub(at))
	f.WriteSpreadMS, f.EffectSpreadMS = float64(spreadOf(began))/1e6, float64(spreadOf(done))/1e6
	for _, p := range procs {
		if _, err := p.ask(&limitMsg{Cleanup: true}); err != nil {
			b.Errorf("limit node: cleanup: %v", err)
		}
	}
	restoreDirect(b, ctx, l, nodes, from, to, "limit")
	return f, took
}
