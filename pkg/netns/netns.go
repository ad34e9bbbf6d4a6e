// Package netns creates, enters and deletes named network namespaces.
//
// It owns only namespace lifecycle; what runs inside belongs to the caller.
// Named namespaces live under /run/netns like those of `ip netns`, so an
// operator can inspect a lab with the usual tools.
package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/cutover-dev/cutover/pkg/execseam"
	"github.com/vishvananda/netns"
)

// Dir is where named namespaces are bind-mounted, as with `ip netns`.
const Dir = "/run/netns"

// Create makes a new named network namespace and brings its loopback up.
// It fails if the name is taken.
func Create(name string) error {
	if err := validName(name); err != nil {
		return err
	}
	if Exists(name) {
		return fmt.Errorf("netns %q: already exists", name)
	}
	if _, err := execseam.Run(exec.Command("ip", "netns", "add", name), ""); err != nil {
		return err
	}
	if _, err := execseam.Run(Command(name, "ip", "link", "set", "lo", "up"), ""); err != nil {
		_ = Delete(name)
		return fmt.Errorf("netns %s: lo up: %w", name, err)
	}
	return nil
}

// Delete removes a named namespace; deleting one that does not exist is not an error.
func Delete(name string) error {
	if err := validName(name); err != nil {
		return err
	}
	if !Exists(name) {
		return nil
	}
	if _, err := execseam.Run(exec.Command("ip", "netns", "delete", name), ""); err != nil {
		return err
	}
	return nil
}

// Exists reports whether the named namespace exists.
func Exists(name string) bool {
	_, err := os.Stat(filepath.Join(Dir, name))
	return err == nil
}

// List returns the named namespaces whose names start with prefix.
func List(prefix string) ([]string, error) {
	ents, err := os.ReadDir(Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Command returns an exec.Cmd that runs argv inside the named namespace.
func Command(name string, argv ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", name}, argv...)...)
}

// Do runs fn with the calling goroutine's OS thread inside the named
// namespace, and restores the original namespace afterwards. Netlink handles
// created inside fn are bound to the namespace.
func Do(name string, fn func() error) error {
	target, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	defer func() { _ = target.Close() }()
	runtime.LockOSThread()
	// The thread is not unlocked: if restoring the original namespace fails,
	// the thread must die with the goroutine rather than serve others from
	// the wrong namespace.
	orig, err := netns.Get()
	if err != nil {
		return fmt.Errorf("netns: current: %w", err)
	}
	defer func() { _ = orig.Close() }()
	if err := netns.Set(target); err != nil {
		return fmt.Errorf("netns %s: enter: %w", name, err)
	}
	ferr := fn()
	if err := netns.Set(orig); err != nil {
		return errors.Join(ferr, fmt.Errorf("netns: restore: %w", err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// Handle returns a file handle on the named namespace for netlink.NewHandleAt.
func Handle(name string) (netns.NsHandle, error) {
	return netns.GetFromName(name)
}

func validName(name string) error {
	if name == "" || len(name) > 64 || strings.ContainsAny(name, "/ \t\n") || name == "." || name == ".." {
		return fmt.Errorf("netns name %q: must be 1-64 characters without '/' or spaces", name)
	}
	return nil
}
