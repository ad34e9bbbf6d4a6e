// Package version holds the build's version string, set by the linker.
package version

// Version is set with -ldflags "-X github.com/cutover-dev/cutover/pkg/version.Version=...".
var Version = "dev"
