package main

import (
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/cutover-dev/cutover/pkg/vxlan"
)

func sh(args ...string) {
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		fmt.Println(args, err, string(out))
		os.Exit(1)
	}
}

func main() {
	n, _ := strconv.Atoi(os.Args[1])
	mode := os.Args[2]
	ns := func(i int) string { return fmt.Sprintf("cotexp%d", i) }
	for i := 1; i <= n; i++ {
		sh("ip", "netns", "add", ns(i))
		sh("ip", "-n", ns(i), "link", "add", "dummy0", "type", "veth", "peer", "name", "dummy1")
		sh("ip", "-n", ns(i), "addr", "add", fmt.Sprintf("198.18.0.%d/24", i), "dev", "dummy0")
		sh("ip", "-n", ns(i), "link", "set", "dummy0", "up")
		sh("ip", "-n", ns(i), "link", "add", "flannel.1", "type", "vxlan", "id", "1", "local", fmt.Sprintf("198.18.0.%d", i), "dev", "dummy0", "dstport", "8472", "nolearning")
		sh("ip", "-n", ns(i), "addr", "add", fmt.Sprintf("198.19.%d.0/32", i), "dev", "flannel.1")
		sh("ip", "-n", ns(i), "link", "set", "flannel.1", "up")
		var batch string
		for j := 1; j <= n; j++ {
			if j == i {
				continue
			}
			mac := fmt.Sprintf("02:c0:de:03:00:%02x", j)
			batch += fmt.Sprintf("neigh add 198.19.%d.0 lladdr %s dev flannel.1 nud permanent\n", j, mac)
			batch += fmt.Sprintf("route add 198.19.%d.0/24 via 198.19.%d.0 dev flannel.1 onlink\n", j, j)
		}
		f, _ := os.CreateTemp("", "b")
		f.WriteString(batch)
		f.Close()
		sh("ip", "-n", ns(i), "-batch", f.Name())
		var fb string
		for j := 1; j <= n; j++ {
			if j != i {
				fb += fmt.Sprintf("fdb add 02:c0:de:03:00:%02x dev flannel.1 dst 198.18.0.%d\n", j, j)
			}
		}
		f2, _ := os.CreateTemp("", "b")
		f2.WriteString(fb)
		f2.Close()
		sh("bridge", "-n", ns(i), "-batch", f2.Name())
	}
	defer func() {
		for i := 1; i <= n; i++ {
			exec.Command("ip", "netns", "del", ns(i)).Run()
		}
	}()
	ks := make([]*vxlan.Kernel, n)
	for i := range ks {
		k, err := vxlan.Open(ns(i + 1))
		if err != nil {
			panic(err)
		}
		k.KeepOld = true
		ks[i] = k
	}
	type res struct{ snap, rec, back, prep, win time.Duration }
	out := make([]res, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range ks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s vxlan.Snapshot
			var err error
			if mode == "presnap" {
				s, err = ks[i].Snapshot("flannel.1")
			}
			<-start
			t0 := time.Now()
			if mode != "presnap" {
				s, err = ks[i].Snapshot("flannel.1")
			}
			if err != nil {
				panic(err)
			}
			t1 := time.Now()
			w, err := ks[i].Recreate(s, 4889)
			if err != nil {
				panic(err)
			}
			t2 := time.Now()
			if _, err := ks[i].Snapshot("flannel.1"); err != nil {
				panic(err)
			}
			t3 := time.Now()
			out[i] = res{t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), w.Prepare, w.Total}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	t0 := time.Now()
	close(start)
	wg.Wait()
	all := time.Since(t0)
	med := func(f func(res) time.Duration) (time.Duration, time.Duration) {
		v := make([]time.Duration, n)
		for i := range out {
			v[i] = f(out[i])
		}
		sort.Slice(v, func(a, b int) bool { return v[a] < v[b] })
		return v[n/2], v[n-1]
	}
	p := func(name string, f func(res) time.Duration) { m, x := med(f); fmt.Printf("%-10s median %-12v max %v\n", name, m, x) }
	fmt.Println("N", n, "mode", mode, "all done in", all)
	p("snapshot", func(r res) time.Duration { return r.snap })
	p("recreate", func(r res) time.Duration { return r.rec })
	p(" prebuild", func(r res) time.Duration { return r.prep })
	p(" window", func(r res) time.Duration { return r.win })
	p("readback", func(r res) time.Duration { return r.back })
}
