package cli

import "golang.org/x/sys/unix"

// ioctlReadTermios reads a terminal's attributes (isTerminal): coordctl and
// kubectl-cutover ship for macOS too (make release).
const ioctlReadTermios = unix.TIOCGETA
