//go:build !linux

package probe

import (
	"net"
	"time"
)

const rxStampsSupported = false

func enableRxStamps(*net.UDPConn) {}

func rxStamp([]byte) (time.Time, bool) { return time.Time{}, false }
