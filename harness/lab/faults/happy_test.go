package faults_test

import (
	"testing"
	"time"
)

// The reference run: no fault. Everything the fault tests compare against
// (ports, rules, records, journal, report) on the success path.
func TestNoFault(t *testing.T) {
	e := newEnv(t, "ok")
	t.Logf("baseline iptables n1:\n%s\nflows n1:\n%s", e.base.IPT["n1"], e.base.Flows["n1"])
	start := time.Now()
	r := e.coordctl("cutover", "--port", "4889")
	t.Logf("cutover exit %d in %s:\n%s", r.code, r.took, r.out)
	if r.code != 0 {
		t.Fatalf("cutover exit %d", r.code)
	}
	port, took := e.consistent(start, toPort)
	e.assertClean(port)
	e.assertAgree(port)
	s := e.snap()
	t.Logf("after: iptables n1:\n%s\nstate n1:\n%s", s.IPT["n1"], s.State["n1"])
	e.fact("none", "-", "converge on 4889", "succeeded", took)
}
