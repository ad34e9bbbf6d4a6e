//go:build tools

// Package tools pins the versions of the build tools (golangci-lint and the
// protoc plugins) in a module of their own so their dependencies never leak
// into the product's go.mod.
package tools

import (
	_ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
	_ "google.golang.org/grpc/cmd/protoc-gen-go-grpc"
	_ "google.golang.org/protobuf/cmd/protoc-gen-go"
)
