package lab

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/cutover-dev/cutover/pkg/atomicfile"
)

// StateFile is the name of the lab's record inside its dir.
const StateFile = "lab.json"

// state is what lab.json holds: enough for Down from a fresh process.
type state struct {
	Config     Config    `json:"config"`
	Phase      string    `json:"phase"` // creating, up, failed
	Created    time.Time `json:"created"`
	Namespaces []string  `json:"namespaces"` // recorded before they are created
	Nodes      []Node    `json:"nodes"`
	Procs      []Proc    `json:"procs"`
	// Set when the processes run.
	CoordinatorTCP string `json:"coordinator_tcp,omitempty"`
	PKIDir         string `json:"pki_dir,omitempty"`
}

// save writes lab.json atomically, so a crash never leaves a torn record.
// Callers hold l.mu.
func (l *Lab) save() error {
	data, err := json.MarshalIndent(&l.st, "", "  ")
	if err != nil {
		return err
	}
	p := filepath.Join(l.st.Config.Dir, StateFile)
	if err := atomicfile.WriteFile(p, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	return nil
}

func (l *Lab) record(f func(*state)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(&l.st)
	return l.save()
}

func (l *Lab) addProc(p Proc) error {
	return l.record(func(s *state) { s.Procs = append(s.Procs, p) })
}

func readState(dir string) (state, error) {
	var st state
	p := filepath.Join(dir, StateFile)
	data, err := os.ReadFile(p)
	if os.IsNotExist(err) {
		return st, fmt.Errorf("lab: no lab in %s (%s missing): %w", dir, StateFile, ErrNotFound)
	}
	if err != nil {
		return st, fmt.Errorf("lab: %w", err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("lab: %s: %w", p, err)
	}
	return st, nil
}
