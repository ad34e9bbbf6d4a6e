// Package pathjudge is the underlay path check's decision core: whom each
// node exchanges frames with (Peers), at which sizes (Sizes) and which
// reference VNI (ReferenceVNI), and, from what every agent saw, the
// verdict of each direction with the problems, warnings and notes that
// name the nodes (Matrix.Judge). A second round's plan (RetryPeers) and
// its answers (MergeSide) are judged by the same rules.
//
// It does no I/O: the coordinator calls the agents (PathCheck) and hands
// their answers in.
package pathjudge
