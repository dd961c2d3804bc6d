#!/usr/bin/env bash
# Makes the two base images of deploy/Dockerfile without any image registry,
# from Debian's package mirror and this machine's Rust toolchain:
#
#   localhost/toolgate-base/debian:bookworm-slim   debootstrap's minbase of
#       Debian 12, slimmed like debian:bookworm-slim (no docs, man pages,
#       locales or apt lists), with the same apt sources (bookworm,
#       bookworm-updates, bookworm-security)
#   localhost/toolgate-base/rust:<version>-bookworm  that root plus gcc and
#       libc6-dev (what the build links and compiles C with), CA certificates
#       (Debian's and this machine's own, /usr/local/share/ca-certificates, for
#       crates.io behind a TLS-inspecting proxy) and the Rust toolchain whose version the Dockerfile's BUILDER_IMAGE
#       names, in the same places as the rust image (RUSTUP_HOME=/usr/local/rustup,
#       CARGO_HOME=/usr/local/cargo on PATH)
#
# then prints the build arguments that use them:
#
#   deploy/image/bases.sh        # as root: debootstrap needs it; ~2 min
#   deploy/image/podman.sh build --network host -f deploy/Dockerfile \
#     --build-arg BUILDER_IMAGE=localhost/toolgate-base/rust:1.95-bookworm \
#     --build-arg RUNTIME_IMAGE=localhost/toolgate-base/debian:bookworm-slim \
#     -t toolgate:0.1.0 .
#
# Needs debootstrap and podman (apt-get install debootstrap podman runc), and a
# toolchain of that version (rustup toolchain install 1.95; the newest patch
# release installed is taken). Images already made by this same script with
# the same toolchain are kept; --rebuild makes them again (for Debian's
# updates). DEBIAN_MIRROR overrides http://deb.debian.org/debian.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PODMAN="$HERE/podman.sh"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
REBUILD=false
[[ ${1:-} == --rebuild ]] && REBUILD=true

log() { printf 'bases.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The Rust version the builder stage names: `ARG BUILDER_IMAGE=rust:1.95-bookworm`.
rust_version="$(sed -n 's/^ARG BUILDER_IMAGE=rust:\([0-9.]*\)-bookworm$/\1/p' "$ROOT/deploy/Dockerfile")"
[[ -n $rust_version ]] || die "deploy/Dockerfile: no line \`ARG BUILDER_IMAGE=rust:<version>-bookworm\`"
RUNTIME_IMAGE="localhost/toolgate-base/debian:$SUITE-slim"
BUILDER_IMAGE="localhost/toolgate-base/rust:$rust_version-$SUITE"

# A toolchain on this machine whose rustc is $rust_version (or one of its
# patch releases): the default one, else any that rustup has.
find_toolchain() {
  local sysroot candidates=() best="" best_version=""
  command -v rustc >/dev/null && candidates+=("$(rustc --print sysroot)")
  if command -v rustup >/dev/null; then
    local home
    home="$(rustup show home 2>/dev/null)" || home="${RUSTUP_HOME:-$HOME/.rustup}"
    for sysroot in "$home"/toolchains/*; do candidates+=("$sysroot"); done
  fi
  for sysroot in "${candidates[@]}"; do
    [[ -x $sysroot/bin/rustc && -x $sysroot/bin/cargo ]] || continue
    local version
    version="$("$sysroot/bin/rustc" --version | awk '{print $2}')"
    if [[ $version == "$rust_version" || $version == "$rust_version".* ]]; then
      if [[ -z $best_version ]] || [[ "$(printf '%s\n%s\n' "$best_version" "$version" | sort -V | tail -1)" == "$version" && $version != "$best_version" ]]; then
        best="$(cd "$sysroot" && pwd -P)"
        best_version="$version"
      fi
    fi
  done
  [[ -n $best ]] && printf '%s %s\n' "$best" "$best_version"
}

toolchain="$(find_toolchain || true)"
if [[ -z $toolchain ]] && command -v rustup >/dev/null; then
  log "no Rust $rust_version toolchain here; rustup toolchain install $rust_version"
  rustup toolchain install "$rust_version" --profile minimal >&2
  toolchain="$(find_toolchain || true)"
fi
[[ -n $toolchain ]] || die "no Rust $rust_version toolchain on this machine (deploy/Dockerfile's builder is rust:$rust_version-bookworm): install it with \`rustup toolchain install $rust_version\`"
read -r sysroot toolchain_version <<<"$toolchain"
log "Rust $toolchain_version from $sysroot"

# This machine's own certificate authorities, beside Debian's.
LOCAL_CAS=/usr/local/share/ca-certificates
local_cas() { find "$LOCAL_CAS" -name '*.crt' -type f 2>/dev/null | sort; }

# What the images are made of: this script, the Containerfile, the local
# CAs, the toolchain.
stamp="$({ cat "$HERE/bases.sh" "$HERE/rust.Containerfile"; local_cas | xargs -r cat; } | sha256sum | cut -c1-16)-$toolchain_version-$(uname -m)"
image_stamp() {
  "$PODMAN" image inspect --format '{{index .Labels "io.toolgate.base.stamp"}}' "$1" 2>/dev/null || true
}

if ! $REBUILD && [[ "$(image_stamp "$RUNTIME_IMAGE")" == "$stamp" ]]; then
  log "$RUNTIME_IMAGE is up to date"
else
  command -v debootstrap >/dev/null || die "debootstrap is missing (apt-get install debootstrap)"
  [[ $(id -u) == 0 ]] || die "debootstrap needs root"
  work="$(mktemp -d "${TMPDIR:-/tmp}/toolgate-bases.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  rootfs="$work/rootfs"
  log "debootstrap $SUITE (minbase) from $MIRROR (about a minute)"
  if ! debootstrap --variant=minbase "$SUITE" "$rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1; then
    tail -20 "$work/debootstrap.log" >&2
    die "debootstrap failed (log above)"
  fi
  # As debian:bookworm-slim: dpkg leaves out documentation and translations
  # from now on, and what debootstrap installed of them goes.
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
CFG
  cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'CFG'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CFG
  rm -f "$rootfs/etc/apt/sources.list"
  cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<CFG
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${MIRROR%/debian}/debian-security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
CFG
  find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$rootfs"/usr/share/{man,groff,info,lintian,linda,locale}/* \
    "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
    "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/* "$rootfs"/tmp/*
  : >"$rootfs/etc/machine-id"
  log "importing $RUNTIME_IMAGE"
  tar --numeric-owner -C "$rootfs" -c . | "$PODMAN" import -q \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' \
    --change "LABEL io.toolgate.base.stamp=$stamp" \
    - "$RUNTIME_IMAGE" >/dev/null
  rm -rf "$work"
  trap - EXIT
fi

if ! $REBUILD && [[ "$(image_stamp "$BUILDER_IMAGE")" == "$stamp" ]]; then
  log "$BUILDER_IMAGE is up to date"
else
  context="$(mktemp -d "${TMPDIR:-/tmp}/toolgate-rust.XXXXXX")"
  trap 'rm -rf "$context"' EXIT
  # The toolchain without its documentation (share/): rustc, cargo, the
  # standard library, clippy and rustfmt when installed.
  mkdir "$context/toolchain" "$context/ca-certificates"
  local_cas | while read -r ca; do cp "$ca" "$context/ca-certificates/"; done
  for part in bin lib libexec etc; do
    [[ -e $sysroot/$part ]] && cp -a "$sysroot/$part" "$context/toolchain/"
  done
  log "building $BUILDER_IMAGE (apt-get gcc; about a minute)"
  "$PODMAN" build --network host -q -f "$HERE/rust.Containerfile" \
    --build-arg BASE="$RUNTIME_IMAGE" \
    --build-arg RUST_VERSION="$toolchain_version" \
    --label "io.toolgate.base.stamp=$stamp" \
    -t "$BUILDER_IMAGE" "$context" >/dev/null
  rm -rf "$context"
  trap - EXIT
fi

printf -- '--build-arg BUILDER_IMAGE=%s --build-arg RUNTIME_IMAGE=%s\n' "$BUILDER_IMAGE" "$RUNTIME_IMAGE"
