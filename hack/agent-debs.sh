#!/usr/bin/env bash
# Fills the per-machine cache of the Debian packages the agent image is
# assembled from (harness/image, make images), without Docker or a registry:
# the Depends/Pre-Depends closure of the given packages for one
# architecture, as apt resolves it now, minus what only a package manager or
# an interpreter needs (the exclusions below, each with its reason).
#
#   ${CUTOVER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cutover}/debs/<arch>/
#     <pkg>_<version>_<arch>.deb   downloaded once per version
#     packages.txt                 "<pkg> <version> <file>" per line, sorted:
#                                  what the image build reads (and nothing else)
#
# A second run with the same apt index downloads nothing. For a foreign
# architecture, root adds it to dpkg and updates apt's index first.
#
# usage: hack/agent-debs.sh <arch> <package>...
set -euo pipefail
arch=${1:?usage: hack/agent-debs.sh <arch> <package>...}
shift
(($#)) || { echo "agent-debs: no packages given" >&2; exit 2; }

cache=${CUTOVER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cutover}/debs/$arch
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

# Not in the image, whatever depends on them: the image runs the agent's
# tools, never a maintainer script, a package manager or a Python script.
#   debconf, debconf-2.0, perl-base, dpkg, adduser, init-system-helpers:
#     maintainer scripts only;
#   python3 (openvswitch-common): its Python utilities (ovs-tcpdump, ...),
#     not ovs-vsctl/ovs-ofctl;
#   openssl (openvswitch-common): the CLI, for ovs-pki; libssl3 stays;
#   python3-netifaces, python3-openvswitch, kmod, module-init-tools,
#   procps, uuid-runtime (openvswitch-switch): its init scripts (ovs-ctl)
#   and Python tools; the image runs ovs-vsctl, never the daemons.
exclude=" debconf debconf-2.0 perl-base dpkg adduser init-system-helpers python3 openssl python3-netifaces python3-openvswitch kmod module-init-tools procps uuid-runtime "

native=$(dpkg --print-architecture)
if [[ $arch != "$native" ]] && ! apt-cache show "libc6:$arch" >/dev/null 2>&1; then
  if [[ $(id -u) != 0 ]]; then
    echo "agent-debs: apt has no $arch index; as root run: dpkg --add-architecture $arch && apt-get update" >&2
    exit 3
  fi
  echo "agent-debs: adding dpkg architecture $arch and updating apt's index" >&2
  dpkg --add-architecture "$arch"
  apt-get update -qq
fi

# Breadth first, one apt-cache call per level (each call loads apt's cache,
# seconds on a busy machine).
declare -A seen=() archall=()
level=("$@")
list=()
while ((${#level[@]})); do
  want=()
  for p in "${level[@]}"; do
    [[ -n ${seen[$p]:-} || $exclude == *" $p "* ]] && continue
    seen[$p]=1
    want+=("$p:$arch")
  done
  ((${#want[@]})) || break
  info=$(apt-cache show --no-all-versions "${want[@]}") || { echo "agent-debs: apt has no package among ${want[*]} (apt-get update?)" >&2; exit 1; }
  # A foreign architecture's query prints nothing for an Architecture: all
  # package (netbase): ask for those as :all.
  all=()
  for w in "${want[@]}"; do
    grep -qx "Package: ${w%:*}" <<<"$info" || all+=("${w%:*}:all")
  done
  if ((${#all[@]})); then
    more=$(apt-cache show --no-all-versions "${all[@]}")
    for w in "${all[@]}"; do
      grep -qx "Package: ${w%:*}" <<<"$more" || { echo "agent-debs: no package ${w%:*} for $arch in apt's index (apt-get update?)" >&2; exit 1; }
    done
    info+=$'\n\n'"$more"
  fi
  # One "<pkg> <version> <dep>,<dep>..." line per stanza.
  mapfile -t rows < <(awk '
    /^Package:/ {p=$2} /^Version:/ {v=$2} /^Architecture: all/ {p = p ":all"}
    /^(Pre-)?Depends:/ {sub(/^[^:]*: /, ""); d = d (d == "" ? "" : ",") $0}
    /^$/ {if (p != "") print p, v, d; p=""; v=""; d=""}
    END {if (p != "") print p, v, d}' <<<"$info")
  level=()
  for r in "${rows[@]}"; do
    read -r p v deps <<<"$r"
    if [[ $p == *:all ]]; then p=${p%:all}; archall[$p]=1; fi
    list+=("$p $v")
    IFS=',' read -ra ds <<<"$deps"
    for d in "${ds[@]}"; do
      d=${d%%|*}                     # the first alternative
      d=$(sed -E 's/\(.*\)//; s/:any//; s/[[:space:]]//g' <<<"$d")
      [[ -n $d ]] && level+=("$d")
    done
  done
done

out=()
for e in "${list[@]}"; do
  p=${e% *}; v=${e#* }
  f="${p}_${v//:/%3a}_"
  have=$(compgen -G "$cache/$f*.deb" | head -1 || true)
  if [[ -z $have ]]; then
    a=$arch
    [[ -n ${archall[$p]:-} ]] && a=all
    (cd "$cache" && apt-get download -qq -o APT::Sandbox::User=root "$p:$a=$v" >/dev/null)
    have=$(compgen -G "$cache/$f*.deb" | head -1 || true)
    [[ -n $have ]] || { echo "agent-debs: apt-get download $p:$arch=$v wrote no $f*.deb" >&2; exit 1; }
    echo "agent-debs: downloaded $(basename "$have")" >&2
  fi
  out+=("$p $v $(basename "$have")")
done
printf '%s\n' "${out[@]}" | LC_ALL=C sort >"$cache/packages.txt.tmp"
mv -f "$cache/packages.txt.tmp" "$cache/packages.txt"
echo "$cache/packages.txt"
