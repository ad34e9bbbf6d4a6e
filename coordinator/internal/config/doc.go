// Package config is the coordinator's configuration: Config with its
// defaults (Default), its flags (AddFlags), its checks (Validate, every
// error naming the flag, the value and what to do) and the static
// inventory it names (LoadInventory: --agent flags and --inventory file).
//
// It reads no cluster and opens no socket; the coordinator package
// re-exports Config and Default.
package config
