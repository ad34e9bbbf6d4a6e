//go:build !linux

package operation

import "time"

// sleepUntilWall has no timerfd here: PreciseSleepUntil sleeps on the
// runtime timer and spins longer.
func sleepUntilWall(time.Time) bool { return false }
