package coordinator

import (
	"github.com/cutover-dev/cutover/coordinator/internal/barrier"
	"github.com/cutover-dev/cutover/coordinator/internal/config"
	"github.com/cutover-dev/cutover/coordinator/internal/metrics"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/coordinator/internal/statedir"
)

// The vocabulary the coordinator shares with its integrations (kube,
// openshift, the harness) is defined in internal/model, below the runner,
// so that the lower layers need not import this package; these aliases
// keep it the public API's.
type (
	// AgentSpec is one agent of the inventory.
	AgentSpec = model.AgentSpec
	// Inventory is the set of agents the coordinator knows.
	Inventory = model.Inventory
	// InventoryError says an inventory (flags, file or cluster) is invalid.
	InventoryError = model.InventoryError
	// OpInfo describes an operation to a Hook.
	OpInfo = model.OpInfo
	// Hook lets a cluster integration act around an operation.
	Hook = model.Hook
	// Planner is a Hook that adds steps to a plan.
	Planner = model.Planner
	// NextStepper is a Hook that adds next steps to a report.
	NextStepper = model.NextStepper
	// NopHook does nothing; embed it to implement only some points.
	NopHook = model.NopHook
	// HookMark is one journaled hook call of an operation.
	HookMark = model.HookMark
	// VerifyInput is what a Verifier is told.
	VerifyInput = model.VerifyInput
	// Verifier checks the dataplane after commit.
	Verifier = model.Verifier
	// VerifierFunc is a Verifier as a function.
	VerifierFunc = model.VerifierFunc
	// InventorySource reads the inventory anew (cluster discovery).
	InventorySource = model.InventorySource
	// Record is what the journal keeps of one operation.
	Record = model.Record
	// JournalStore keeps operation records.
	JournalStore = model.JournalStore
	// Journal is the file journal in --state-dir.
	Journal = statedir.Journal
	// StateDirLockedError says another process holds the --state-dir lock.
	StateDirLockedError = statedir.StateDirLockedError
)

// OverlayLabel is the node label naming a node's overlay.
const OverlayLabel = model.OverlayLabel

// DefaultOverlay is the overlay of a node without OverlayLabel.
const DefaultOverlay = model.DefaultOverlay

// DefaultJournalKeep is how many finished operations the journal keeps.
const DefaultJournalKeep = model.DefaultJournalKeep

// LockFile is the name of the lock in --state-dir.
const LockFile = statedir.LockFile

// ParseAgentFlags parses --agent node=host:port[@overlay] values.
func ParseAgentFlags(vals []string) ([]AgentSpec, error) { return model.ParseAgentFlags(vals) }

// LoadInventoryFile reads a JSON inventory file.
func LoadInventoryFile(path string) ([]AgentSpec, error) { return model.LoadInventoryFile(path) }

// NewInventory validates specs (from source, for errors) into an Inventory.
func NewInventory(source string, specs []AgentSpec) (Inventory, error) {
	return model.NewInventory(source, specs)
}

// IsInventoryError reports whether err says an inventory is invalid.
func IsInventoryError(err error) bool { return model.IsInventoryError(err) }

// Prunable returns the records a journal keeping keep finished operations
// drops (model.Prunable).
func Prunable(recs []Record, keep int) []Record { return model.Prunable(recs, keep) }

// OpenJournal opens the file journal in dir, creating it if needed.
func OpenJournal(dir string) (*Journal, error) { return statedir.OpenJournal(dir) }

// IsStateDirLocked reports whether err says the state dir is held by
// another process.
func IsStateDirLocked(err error) bool { return statedir.IsStateDirLocked(err) }

// Strategies, as CutoverRequest.strategy spells them.
const (
	StrategyAtomic = model.StrategyAtomic
	StrategyStaged = model.StrategyStaged
	// StrategyAuto is resolved from the preflight's Preflight answers
	// before the operation starts: the report and the journal name the
	// strategy that ran.
	StrategyAuto = model.StrategyAuto
)

// The late-commit policies (Config.LatePolicy).
const (
	LateRollback = config.LateRollback
	LateWait     = config.LateWait
)

// Config is the coordinator's configuration (internal/config).
type Config = config.Config

// Default is the configuration with every default set.
func Default() Config { return config.Default() }

// Metrics are the coordinator's Prometheus metrics (internal/metrics).
type Metrics = metrics.Metrics

// NewMetrics registers the metrics in a fresh registry.
func NewMetrics() *Metrics { return metrics.New() }

// Hook points, as journaled in Record.Hooks: the core's names.
const (
	HookBeforeCommit = string(barrier.HookBeforeCommit)
	HookAfterConfirm = string(barrier.HookAfterConfirm)
	HookFinalize     = string(barrier.HookFinalize)
	HookRestore      = string(barrier.HookRestore)
)

// States of a journaled hook call: the core's names.
const (
	HookStarted = string(barrier.MarkStarted) // journaled before the call: it may have acted
	HookDone    = string(barrier.MarkDone)
	HookFailed  = string(barrier.MarkFailed)
)
