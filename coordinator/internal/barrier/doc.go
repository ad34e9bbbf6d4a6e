// Package barrier is the coordinator's planning and barrier core: a
// deterministic state machine that decides, for one operation, which step
// to send to which agents next and what the outcome is.
//
// It is fed events (an agent answered ok or failed for a step, a call timed
// out, a step's deadline passed, the operator asked for a rollback) and
// returns actions (send step S to agents X within D, declare the outcome).
// It is modelled on etcd-io/raft's Step/quorum: it owns no sockets, reads
// no clock and starts no goroutines, so every interleaving can be replayed
// from a script (testdata/*.txt) and explored at random.
//
// The plan of an operation is prepare → commit → verify → confirm →
// finalize. Preflight is read-only and runs before an operation exists (a
// failed preflight leaves no operation behind), so it is not a step here.
//
// Rules the machine enforces:
//
//   - A step is a barrier: it completes only when every agent sent that
//     step has answered or timed out. Only then does the machine move on,
//     abort or roll back, so a Rollback never overtakes a Prepare or Commit
//     still in flight to the same agent.
//   - I2: Commit is sent only after every target answered Prepare ok.
//   - Any prepare failure or timeout → abort: Rollback to every agent that
//     was sent Prepare (a failed or timed-out prepare may have done part
//     of its work; Rollback is idempotent on the agent). Nothing flipped.
//   - Any commit, verify or confirm failure or timeout → rollback: Rollback
//     to every agent that was sent Prepare, which includes every agent that
//     may have committed (a commit that timed out may have applied).
//   - Lateness is judged by when a node applied, never by when its answer
//     arrived (an answer leaves after the apply, and at N = 32 the answers
//     of nodes that applied within 11 ms of the instant came ~600 ms after
//     it in the lab). With Config.LateBudget set, a Commit answer that
//     applied more than the budget after the instant (Reply.Lateness, what
//     the node reported, converted to the coordinator's clock, less the
//     clock offset's error bound) is status late: once the others
//     answered, everyone is rolled back. The answer has its own, longer
//     deadline: a node with no answer by then (Late) is resolved at once,
//     status late, like a commit timeout, and everyone is rolled back, the
//     silent node too. The rollback to it may overtake its Commit still in
//     flight; the agent serialises the two, and one that wakes past the
//     budget applies nothing (and one that did apply is reverted by the
//     rollback). This bounds the split to about the answer deadline
//     instead of however long the node was away (docs/faults.md, "Late
//     commits"). Under the wait policy (Config.LateWait) a late node is
//     the report's: a Late changes nothing, and the Commit step waits for
//     the node's answer or timeout. The runner feeds Late under both
//     policies; the policy is decided here.
//   - Finalize failures do not change the outcome (the change is confirmed
//     everywhere; only the old port's firewall rules remain) but are
//     recorded per node.
//   - An abort or rollback that cannot reach everyone is retried, only to
//     the agents not yet reached, with back-off: the retry's Send carries
//     After, a pause that starts at Config.RetryBackoff and doubles up to
//     Config.RetryBackoffMax. It is retried at least RollbackAttempts
//     times in all and until the pauses and the calls that timed out add
//     up to Config.RetryFor, then the outcome is Failed, naming the
//     unreached nodes. An agent that is merely restarting is reached by a
//     later attempt instead of failing the operation; the caller sets
//     RetryFor to cover the agents' dead-man, by the end of which an agent
//     that stayed unreachable has reverted by itself (I4). The core keeps
//     no clock: it adds up the pauses it asked for and one StepTimeout per
//     attempt that timed out, a lower bound of the time really spent.
//   - Duplicate replies, replies for an earlier step or attempt, and
//     replies after a timeout change nothing.
//   - An operator's rollback request takes effect at the next barrier, or
//     once the hook calls or the verifier in progress ended: asked during
//     BeforeCommit it aborts instead of committing; asked during the
//     Finalize hooks or the probe read it rolls the finished change back
//     instead of declaring success.
//
// What the application does around the agents' steps is ordered here too
// (etcd-io/raft's Ready: the runner performs actions and feeds back
// events, and holds no policy of its own):
//
//   - Journal comes before every Send: after a crash the record never
//     claims less than what the agents may have seen (commit-sent above
//     all). The write's failure is an event (JournalFailed), fed back at
//     once. A Commit's Journal is Required: the Commit is not sent, and
//     the operation is undone as if the commit had failed everywhere,
//     commit-sent as it was before (an atomic operation aborts; a staged
//     one past its first batch unswitches). Before any other step the
//     send goes on (an undo never waits on the disk; the other steps
//     replay safely) and Declare.Notes says what the journal missed.
//   - The probe counters' reset rides in the first Prepare
//     (Send.ResetProbes; not before it: a frozen agent must not hold up
//     everyone's Prepare), ResetProbes{Rode} resets the agents that did
//     not take it, and the prepare barrier completes only once
//     ProbesReset came back, so Commit never overtakes a reset.
//   - Once every agent is prepared, the hooks' BeforeCommit calls are made
//     one at a time, in order, each only once journaled as started; the
//     first failure stops the others and aborts (nothing has flipped).
//     Commit goes out only after every one succeeded.
//   - Once every read-back passed, the operation-wide verifier runs
//     (RunVerifier); its failure rolls back.
//   - Once every agent confirmed, the hooks' AfterConfirm calls are made,
//     all of them, before Finalize is sent; once every agent finalized,
//     the hooks' Finalize calls are made before success is declared.
//     Their errors are recorded (Declare.Notes); the outcome stands.
//   - When an abort or rollback reached everyone, Restore is called, in
//     reverse order, on every hook whose BeforeCommit was started (it may
//     have acted even if it failed), before the outcome is declared;
//     its errors are recorded, the outcome stands.
//   - When an operation that sent Commit ends, whatever its outcome, the
//     probe counters are read (ReadProbes) before Declare.
//   - A resumed operation gets the hook calls journaled so far
//     (Config.HookMarks): a BeforeCommit once started is never made again
//     (it is restored instead), an AfterConfirm or Finalize that a restart
//     interrupted is made again, one that finished is not, and Restore is
//     made until it succeeds.
//   - Where a restarted coordinator picks an operation up is decided here
//     too (ChooseResume): abort before commit, finish an undo in flight,
//     verify after commit only when every agent says it is committed,
//     else roll back. The runner only gathers the agents' answers, and
//     only when NeedsAgents says they matter.
//
// # Files
//
// Each file holds one concern. The vocabulary comes first and names
// nothing of the machine; the machine is Op, whose methods are split by
// concern over the files after it and call each other across them:
//
//   - vocabulary.go: the words every file uses: Step, Outcome, Status,
//     NodeStep, and the hooks' HookPoint, HookState and HookMark.
//   - config.go: Config, what one operation is asked to do.
//   - events.go: Event and what the caller feeds back (Reply, Timeout,
//     Deadline, Late, StepFailed, RollbackRequested, HookDone, Verified,
//     ProbesReset, ProbesRead, JournalFailed).
//   - actions.go: Action and what the caller is asked to do (Send,
//     Journal, CallHook, RunVerifier, ResetProbes, ReadProbes, Declare),
//     each with the canonical text the golden scenarios compare.
//   - op.go: the state machine itself: Op, New, Start and Step, the
//     barrier of each step, the next step of the plan, the end of an
//     operation, its accessors and its canonical dump.
//   - hooks.go: hook sequencing: which hook calls are due given the
//     journal (due), one at a time, and what their end leads to.
//   - staged.go: the staged strategy: batches, the hold of a subset, and
//     Unswitch before Rollback.
//   - retry.go: an abort, rollback or unswitch that missed nodes: its
//     retries, their back-off and when it gives up (Failed).
//   - resume.go: resume policy: where a restarted coordinator picks an
//     operation up (ChooseResume, ChooseStagedResume, NeedsAgents) and
//     how it starts there (ResumeAt, Ended).
//
// This package must not do I/O, read clocks or know about gRPC.
package barrier
