// Package statedir owns the coordinator's --state-dir on disk: the file
// journal (one atomically replaced JSON record per operation under
// operations/, pruned by model.Prunable) and the flock that keeps a second
// coordinator off the same journal.
//
// It knows nothing of operations beyond model.Record: what to write and
// when is the runner's business.
package statedir
