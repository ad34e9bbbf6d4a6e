#!/usr/bin/env bash
# make release VERSION=vX.Y.Z: everything a release publishes, into
# $RELEASE_ROOT/$VERSION/ (default bin/release/<version>/):
#   cutover-<overlay>-<version>.yaml   per overlay, images pinned by digest
#   cutover-{agent,coordinator,pause}-<version>.tar   OCI image layout tarballs
#   images.txt                          "<file> <ref> <repo>@<digest>" per image
#   coordctl-<version>-<os>-<arch>, kubectl-cutover-<version>-<os>-<arch>
#   RELEASE-NOTES.md                    CHANGELOG.md's section for <version>
#   SHA256SUMS                          over every other file
# Overlays: $RELEASE_OVERLAYS; image architectures: $IMAGE_ARCHES.
set -euo pipefail
cd "$(dirname "$0")/.."

version=${VERSION:-}
if [[ ! $version =~ ^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$ ]]; then
  echo "release: VERSION=\"$version\": not a release version: want vMAJOR.MINOR.PATCH (semver without pre-release or build, e.g. VERSION=v0.1.0)" >&2
  exit 2
fi
changelog=${CHANGELOG:-CHANGELOG.md}
notes=$(awk -v v="$version" '
  $0 ~ "^## \\[" {if (on) exit; if (index($0, "## [" substr(v, 2) "]") == 1 || index($0, "## [" v "]") == 1) on = 1}
  on' "$changelog")
if [[ -z $notes ]]; then
  echo "release: $changelog has no \"## [${version#v}]\" section for VERSION=$version: add what the release changes first" >&2
  exit 2
fi
overlays=${RELEASE_OVERLAYS:-openshift flannel calico full}
arches=${IMAGE_ARCHES:-amd64 arm64}
out=${RELEASE_ROOT:-bin/release}/$version
rm -rf "$out"
mkdir -p "$out"
ldflags="-s -w -X github.com/cutover-dev/cutover/pkg/version.Version=$version"

# Images: the static binaries per architecture, then the tarballs.
for a in $arches; do
  hack/agent-debs.sh "$a" $AGENT_PACKAGES >/dev/null
  CGO_ENABLED=0 GOOS=linux GOARCH=$a go build -trimpath -ldflags "$ldflags" -o "bin/linux-$a/" \
    ./agent/cmd/agent ./coordinator/cmd/coordinator ./coordinator/cmd/coordctl ./harness/cmd/cutover-pause
done
go run ./harness/cmd/cutover-image --version "$version" --bin bin --out "$out" --arch "$(tr ' ' , <<<"$arches")"

# Manifests: every overlay with both images pinned to the tarballs' digests.
digest() { awk -v r="$1" '$3 ~ "^" r "@" {split($3, a, "@"); print a[2]}' "$out/images.txt"; }
agent=$(digest ghcr.io/cutover-dev/cutover-agent)
coord=$(digest ghcr.io/cutover-dev/cutover-coordinator)
k=$(hack/kube-tools.sh kustomize)
for o in $overlays; do
  d=$(mktemp -d)
  cp -r deploy "$d/"
  printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [deploy/overlays/%s]\nimages:\n- {name: ghcr.io/cutover-dev/cutover-agent, digest: "%s"}\n- {name: ghcr.io/cutover-dev/cutover-coordinator, digest: "%s"}\n' "$o" "$agent" "$coord" >"$d/kustomization.yaml"
  "$k" build "$d" >"$out/cutover-$o-$version.yaml"
  rm -rf "$d"
  if grep -nE 'image: .*:latest|image: [^@]*$' "$out/cutover-$o-$version.yaml"; then
    echo "release: $o: an image not pinned by digest in the rendered manifests" >&2
    exit 1
  fi
done

# The CLIs for workstations.
for os in linux darwin; do
  for a in amd64 arm64; do
    for c in coordctl kubectl-cutover; do
      CGO_ENABLED=0 GOOS=$os GOARCH=$a go build -trimpath -ldflags "$ldflags" -o "$out/$c-$version-$os-$a" "./coordinator/cmd/$c"
    done
  done
done

printf '%s\n' "$notes" >"$out/RELEASE-NOTES.md"
(cd "$out" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
echo "release: $out"
ls -l "$out"
