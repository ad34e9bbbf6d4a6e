#!/usr/bin/env bash
# Builds (once per machine) or reuses the Kubernetes test tier's tools and
# prints the path of each: kube-apiserver (k8s.io/kubernetes as a library,
# pinned in tools/kube/go.mod) and kustomize. The binaries are cached outside
# the repository, keyed by version, so a second run costs nothing:
#   ${CUTOVER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cutover}/kube-apiserver-<version>
#   ${CUTOVER_CACHE_DIR:-...}/kustomize-<version>
# harness/kubetest finds them at the same paths.
#
# usage: hack/kube-tools.sh [kube-apiserver|kustomize]...   (default: both)
set -euo pipefail
cd "$(dirname "$0")/../tools/kube"

cache=${CUTOVER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cutover}
mkdir -p "$cache"

modversion() { go list -m -f '{{.Version}}' "$1"; }

build() { # name version package
  local name=$1 version=$2 pkg=$3
  local out="$cache/$name-$version"
  # One builder at a time per machine: parallel CI jobs or a developer's
  # second shell wait for the first build instead of repeating it.
  exec 9>"$cache/.$name.lock"
  flock 9
  if [[ ! -x $out ]]; then
    echo "kube-tools: building $name $version (first time on this machine; kube-apiserver takes minutes)" >&2
    local start=$SECONDS
    CGO_ENABLED=0 go build -trimpath -o "$out.tmp.$$" "$pkg"
    mv -f "$out.tmp.$$" "$out"
    echo "kube-tools: built $out in $((SECONDS - start))s" >&2
  fi
  exec 9>&-
  echo "$out"
}

want=("$@")
((${#want[@]})) || want=(kube-apiserver kustomize)
for w in "${want[@]}"; do
  case $w in
    kube-apiserver) build kube-apiserver "$(modversion k8s.io/kubernetes)" k8s.io/kubernetes/cmd/kube-apiserver ;;
    kustomize) build kustomize "$(modversion sigs.k8s.io/kustomize/kustomize/v5)" sigs.k8s.io/kustomize/kustomize/v5 ;;
    *) echo "kube-tools: unknown tool $w (want kube-apiserver or kustomize)" >&2; exit 2 ;;
  esac
done
