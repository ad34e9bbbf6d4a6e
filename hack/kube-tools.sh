#!/usr/bin/env bash
# Builds (once per machine) or reuses the Kubernetes test tiers' tools and
# prints the path of each. All come from the one k8s.io/kubernetes pinned in
# tools/kube/go.mod (as a library: its replace directives rule out `go
# install`), plus kustomize. The binaries are cached outside the repository,
# keyed by version, so a second run costs nothing:
#   ${CUTOVER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cutover}/<tool>-<version>
# harness/kubetest and harness/cluster find them at the same paths.
#
# The Kubernetes binaries are stamped with their version (component-base's
# gitVersion): unstamped they say v0.0.0-master, which kubectl and the
# kubelet's node registration cannot parse.
#
# usage: hack/kube-tools.sh [TOOL]...   (default: kube-apiserver kustomize)
#   TOOL: kube-apiserver kube-controller-manager kube-scheduler kubelet
#         kube-proxy kubectl kustomize containerd, or "cluster" for all of them
set -euo pipefail
cd "$(dirname "$0")/../tools/kube"

cache=${CUTOVER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cutover}
mkdir -p "$cache"

modversion() { go list -m -f '{{.Version}}' "$1"; }

kver=$(modversion k8s.io/kubernetes)
kmajor=${kver#v}; kmajor=${kmajor%%.*}
kminor=${kver#v*.}; kminor=${kminor%%.*}
kldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kver -X k8s.io/component-base/version.gitMajor=$kmajor -X k8s.io/component-base/version.gitMinor=$kminor -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=$kver -X k8s.io/client-go/pkg/version.gitMajor=$kmajor -X k8s.io/client-go/pkg/version.gitMinor=$kminor"

# build NAME... : builds the named Kubernetes tools missing from the cache in
# one go build (they share most packages, so one compile is much cheaper
# than one per binary).
build_kube() {
  local missing=() pkgs=() n
  for n in "$@"; do [[ -x $cache/$n-$kver ]] || missing+=("$n"); done
  ((${#missing[@]})) || return 0
  # One builder at a time per machine: parallel CI jobs or a developer's
  # second shell wait for the first build instead of repeating it.
  exec 9>"$cache/.kube.lock"
  flock 9
  missing=(); for n in "$@"; do [[ -x $cache/$n-$kver ]] || missing+=("$n"); done
  if ((${#missing[@]})); then
    for n in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$n"); done
    echo "kube-tools: building ${missing[*]} $kver (first time on this machine; minutes)" >&2
    local start=$SECONDS tmp
    tmp=$(mktemp -d "$cache/.build.XXXXXX")
    CGO_ENABLED=0 go build -trimpath -ldflags "$kldflags" -o "$tmp/" "${pkgs[@]}"
    for n in "${missing[@]}"; do mv -f "$tmp/$n" "$cache/$n-$kver"; done
    rmdir "$tmp"
    echo "kube-tools: built ${missing[*]} in $((SECONDS - start))s" >&2
  fi
  exec 9>&-
}

build_kustomize() {
  local version out
  version=$(modversion sigs.k8s.io/kustomize/kustomize/v5)
  out="$cache/kustomize-$version"
  exec 9>"$cache/.kustomize.lock"
  flock 9
  if [[ ! -x $out ]]; then
    echo "kube-tools: building kustomize $version" >&2
    CGO_ENABLED=0 go build -trimpath -o "$out.tmp.$$" sigs.k8s.io/kustomize/kustomize/v5
    mv -f "$out.tmp.$$" "$out"
  fi
  exec 9>&-
  echo "$out"
}

# containerd 2.x for the real-cluster tier's nodes, from its Go module (no
# replace directives, so go install works), static: the btrfs snapshotter
# needs cgo and is left out; overlayfs is what the nodes use.
CONTAINERD_VERSION=v2.4.2 # harness/cluster.ContainerdVersion
build_containerd() {
  local out="$cache/containerd-$CONTAINERD_VERSION"
  exec 9>"$cache/.containerd.lock"
  flock 9
  if [[ ! -x $out/ctr ]]; then
    echo "kube-tools: building containerd $CONTAINERD_VERSION (first time on this machine; minutes)" >&2
    local start=$SECONDS tmp
    tmp=$(mktemp -d "$cache/.build.XXXXXX")
    local m=github.com/containerd/containerd/v2
    CGO_ENABLED=0 GOBIN=$tmp go install -trimpath -ldflags "-s -w -X $m/version.Version=$CONTAINERD_VERSION" \
      "$m/cmd/containerd@$CONTAINERD_VERSION" "$m/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" "$m/cmd/ctr@$CONTAINERD_VERSION"
    rm -rf "$out"; mv "$tmp" "$out"
    echo "kube-tools: built containerd in $((SECONDS - start))s" >&2
  fi
  exec 9>&-
  echo "$out"
}

kube_tools=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
want=("$@")
((${#want[@]})) || want=(kube-apiserver kustomize)
if [[ " ${want[*]} " == *" cluster "* ]]; then want=("${kube_tools[@]}" kustomize containerd); fi
kube=()
for w in "${want[@]}"; do
  case " ${kube_tools[*]} kustomize containerd " in
    *" $w "*) [[ $w == kustomize || $w == containerd ]] || kube+=("$w") ;;
    *) echo "kube-tools: unknown tool $w (want one of ${kube_tools[*]} kustomize containerd, or cluster)" >&2; exit 2 ;;
  esac
done
((${#kube[@]} == 0)) || build_kube "${kube[@]}"
for w in "${want[@]}"; do
  case $w in
    kustomize) build_kustomize ;;
    containerd) build_containerd ;;
    *) echo "$cache/$w-$kver" ;;
  esac
done
