//go:build tools

// Package tools pins flanneld's module for hack/flannel-tools.sh.
package tools

import _ "github.com/flannel-io/flannel"
