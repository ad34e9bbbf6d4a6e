// Package probemesh decides the probe mesh: which peers each node probes
// (Sample, a ring at spread distances, the same on every coordinator for
// the same inventory) and, after a commit, what each sampled pair's
// counters say (JudgePair: a probe answered that was sent after both ends
// flipped passes; Outcome sorts the pairs into dark, missing and dark
// before the change).
//
// It does no I/O and reads no clock: the runner reads the agents'
// ProbeStats and the flip instants and hands them in.
package probemesh
