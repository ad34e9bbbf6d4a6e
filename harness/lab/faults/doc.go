// Package faults is Cutover's fault suite: end-to-end tests that break a
// running lab (harness/lab: real agents, real coordinator, one Open vSwitch
// per node, mTLS) at a chosen phase of a cutover and assert what must hold
// afterwards — one consistent VXLAN port on every reachable node within
// 10 s (read from OVS itself), no orphan firewall rule or flow, agent
// records and the coordinator's journal that agree, and a report that says
// what happened. It also holds the end-to-end security and bad-input
// tests. docs/faults.md tabulates what the tests observed.
//
// Phases are hit with hooks the test really controls: a spin on the
// agent's state file or the coordinator's journal (the first durable trace
// of a transition), and SIGSTOP of a process to hold the coordinator at a
// barrier. Every test checks where it actually landed before asserting.
//
// The package has only tests; it must not be imported. Each test makes its
// own lab (namespaces cot-lab-f<test><random>-*) and tears it down.
package faults
