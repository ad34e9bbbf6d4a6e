//go:build !linux

package probe

import "time"

const rxStampsSupported = false

func rxStamp([]byte) (time.Time, bool) { return time.Time{}, false }
