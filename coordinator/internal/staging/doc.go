// Package staging plans the staged strategy (docs/staged.md): which
// nodes switch in which batch (PlanBatches, from cumulative sizes such as
// "1" then "100%"), how many change at a time within a phase (WaveSize,
// Waves) and how long such a phase may take (Bounds), which nodes a held
// operation's continuation switches (Continue, held.go), and how the
// report shows the batches.
//
// It is pure: the barrier core runs the batches (barrier.Config.Batches);
// the coordinator resolves the request and hands the nodes in.
package staging
