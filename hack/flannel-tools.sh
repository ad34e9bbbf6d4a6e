#!/usr/bin/env bash
# Builds (once per machine) or reuses flanneld for the real-cluster tier's
# flannel scenarios and prints its path. flanneld comes from its Go module,
# pinned in tools/flannel/go.mod, into the cache hack/kube-tools.sh uses:
#   ${CUTOVER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cutover}/flanneld-<version>
# harness/cluster.FlanneldPath finds it there.
#
# Static, but with cgo: flannel's udp backend (pkg/backend/udp/cproxy_amd64.go)
# is cgo-only on amd64, and its main package imports every backend, so
# CGO_ENABLED=0 does not build (it does on arm64). -extldflags -static keeps
# the binary free of the host's libc for the scratch-based image.
set -euo pipefail
cd "$(dirname "$0")/../tools/flannel"

cache=${CUTOVER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cutover}
mkdir -p "$cache"
version=$(go list -m -f '{{.Version}}' github.com/flannel-io/flannel)
out="$cache/flanneld-$version"
exec 9>"$cache/.flannel.lock"
flock 9
if [[ ! -x $out ]]; then
  echo "flannel-tools: building flanneld $version (first time on this machine; minutes)" >&2
  start=$SECONDS
  cgo=1; [[ $(go env GOARCH) == amd64 ]] || cgo=0
  CGO_ENABLED=$cgo go build -trimpath \
    -ldflags "-s -w -extldflags -static -X github.com/flannel-io/flannel/pkg/version.Version=$version" \
    -o "$out.tmp.$$" github.com/flannel-io/flannel
  mv -f "$out.tmp.$$" "$out"
  echo "flannel-tools: built flanneld $version in $((SECONDS - start))s" >&2
fi
exec 9>&-
echo "$out"
