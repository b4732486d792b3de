#!/usr/bin/env bash
# Installs what gpucr needs to build and test on Debian 12 (or newer), as root,
# non-interactively. Idempotent: a second run only checks and returns in seconds.
#
#   - Debian packages: protobuf-c, liburing, libuv, CRIU's build dependencies.
#   - CRIU >= 4.0 under /usr/local. Debian 12's criu 3.17 fails `criu check` on
#     current kernels (vDSO layout), so CRIU 4.1.1 is built from Debian 13's
#     upstream tarball, fetched with apt's source download, sha256-checked.
#     Its stock cuda plugin is built too (the baseline the benchmarks compare
#     against) and kept apart from CRIU's plugin dir, so it never loads unasked.
#   - protobuf-c's runtime source (Debian 12's source package), built with -fPIC:
#     Debian's libprotobuf-c.a is not position-independent, and the driver shim
#     and the CRIU plugin must carry the runtime inside them.
#   - The CUDA toolkit is not installed here: it must be at $CUDA_HOME or
#     /usr/local/cuda.
#
# Environment: GPUCR_DEPS_PREFIX (default /usr/local), GPUCR_SKIP_APT=1 to skip
# the package step (packages already installed by other means).
set -euo pipefail

PREFIX=${GPUCR_DEPS_PREFIX:-/usr/local}
SRCDIR=$PREFIX/src/gpucr-deps
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

CRIU_VERSION=4.1.1
CRIU_TARBALL=criu_${CRIU_VERSION}.orig.tar.xz
CRIU_SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
PBC_VERSION=1.4.1
PBC_TARBALL=protobuf-c_${PBC_VERSION}.orig.tar.gz
PBC_SHA256=4cc4facd508172f3e0a4d3a8736225d472418aee35b4ad053384b137b220339f

APT_PACKAGES=(
	build-essential pkg-config patchelf xz-utils ca-certificates python3
	protobuf-c-compiler libprotobuf-c-dev liburing-dev libuv1-dev
	# CRIU's build dependencies
	libprotobuf-dev protobuf-compiler libnl-3-dev libnet1-dev libcap-dev
	libbsd-dev libgnutls28-dev libnftables-dev libdrm-dev uuid-dev
	python3-protobuf iproute2 procps
)

say() { printf 'install-deps: %s\n' "$*"; }
die() { printf 'install-deps: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (it installs Debian packages and CRIU under $PREFIX)"
[ "$(uname -m)" = x86_64 ] || die "gpucr supports x86-64 only (this is $(uname -m))"

# --- CUDA toolkit ---------------------------------------------------------
if [ ! -f "$CUDA_HOME/include/cuda.h" ] || [ ! -e "$CUDA_HOME/lib64/stubs/libcuda.so" ]; then
	die "the CUDA toolkit was not found at $CUDA_HOME (need include/cuda.h and lib64/stubs/libcuda.so).
  Install the CUDA toolkit 12.8 or newer (NVIDIA's cuda-toolkit package, or the runfile with
  --toolkit), or point CUDA_HOME at an existing one."
fi

# --- Debian packages ------------------------------------------------------
missing_pkgs() {
	local p
	for p in "${APT_PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
	done
}

if [ "${GPUCR_SKIP_APT:-0}" != 1 ]; then
	mapfile -t need < <(missing_pkgs)
	if [ ${#need[@]} -gt 0 ]; then
		say "installing Debian packages: ${need[*]}"
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	fi
fi

# Fetches the upstream tarball of a Debian source package through a temporary
# sources list, so the host's own apt configuration is left untouched. The
# .dsc of an older upload may no longer be served while the tarball is, so
# apt's error for the other files is not fatal; the checksum decides.
fetch_source_tarball() { # suite package tarball sha256
	local suite=$1 pkg=$2 tarball=$3 sum=$4 tmp
	if [ -f "$SRCDIR/$tarball" ] && echo "$sum  $SRCDIR/$tarball" | sha256sum -c --status; then
		return 0
	fi
	tmp=$(mktemp -d)
	mkdir -p "$tmp/lists/partial" "$tmp/parts" "$SRCDIR"
	cat >"$tmp/src.sources" <<-EOF
	Types: deb-src
	URIs: http://deb.debian.org/debian
	Suites: $suite
	Components: main
	Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
	EOF
	local o=(-o "Dir::Etc::SourceList=$tmp/src.sources" -o "Dir::Etc::SourceParts=$tmp/parts"
		-o "Dir::State::Lists=$tmp/lists" -o "APT::Sandbox::User=root")
	say "fetching $tarball (Debian $suite source package $pkg)"
	apt-get "${o[@]}" update -qq >/dev/null 2>&1 || { rm -rf "$tmp"; die "apt-get update for Debian $suite sources failed"; }
	(cd "$tmp" && apt-get "${o[@]}" source --download-only "$pkg" >/dev/null 2>&1) || true
	[ -f "$tmp/$tarball" ] || { rm -rf "$tmp"; die "could not download $tarball from Debian $suite"; }
	echo "$sum  $tmp/$tarball" | sha256sum -c --status ||
		{ rm -rf "$tmp"; die "$tarball: sha256 mismatch (expected $sum)"; }
	mv "$tmp/$tarball" "$SRCDIR/$tarball"
	rm -rf "$tmp"
}

# --- CRIU -----------------------------------------------------------------
criu_version_ok() { # path
	local v
	v=$("$1" --version 2>/dev/null | awk '/^Version:/ {print $2}') || return 1
	[ -n "$v" ] || return 1
	[ "${v%%.*}" -ge 4 ] 2>/dev/null
}

criu_bin=$(command -v criu || true)
if [ -x "$PREFIX/sbin/criu" ]; then criu_bin=$PREFIX/sbin/criu; fi
if [ -z "$criu_bin" ] || ! criu_version_ok "$criu_bin" ||
	[ ! -f "$PREFIX/include/criu/criu-plugin.h" ] ||
	[ ! -f "$PREFIX/lib/gpucr-deps/criu-stock-plugins/cuda_plugin.so" ]; then
	fetch_source_tarball trixie criu "$CRIU_TARBALL" "$CRIU_SHA256"
	build=$(mktemp -d)
	say "building CRIU $CRIU_VERSION in $build"
	tar -C "$build" -xf "$SRCDIR/$CRIU_TARBALL"
	(
		cd "$build/criu-$CRIU_VERSION"
		make -j"$(nproc)" criu >"$build/build.log" 2>&1 &&
			make -j"$(nproc)" cuda_plugin >>"$build/build.log" 2>&1
	) || { tail -30 "$build/build.log" >&2; die "CRIU build failed (log: $build/build.log)"; }
	install -D -m 0755 "$build/criu-$CRIU_VERSION/criu/criu" "$PREFIX/sbin/criu"
	install -D -m 0644 "$build/criu-$CRIU_VERSION/criu/include/criu-plugin.h" \
		"$PREFIX/include/criu/criu-plugin.h"
	install -D -m 0644 "$build/criu-$CRIU_VERSION/plugins/cuda/cuda_plugin.so" \
		"$PREFIX/lib/gpucr-deps/criu-stock-plugins/cuda_plugin.so"
	mkdir -p /usr/lib/criu
	rm -rf "$build"
	hash -r
	say "installed $("$PREFIX/sbin/criu" --version | head -1) at $PREFIX/sbin/criu"
fi

# --- protobuf-c runtime source (for -fPIC builds) ---------------------------
if [ ! -f "$SRCDIR/protobuf-c-$PBC_VERSION/protobuf-c/protobuf-c.c" ]; then
	fetch_source_tarball bookworm protobuf-c "$PBC_TARBALL" "$PBC_SHA256"
	tar -C "$SRCDIR" -xzf "$SRCDIR/$PBC_TARBALL" \
		"protobuf-c-$PBC_VERSION/protobuf-c/protobuf-c.c" \
		"protobuf-c-$PBC_VERSION/protobuf-c/protobuf-c.h"
	say "protobuf-c $PBC_VERSION runtime source at $SRCDIR/protobuf-c-$PBC_VERSION"
fi

say "ok: $("$PREFIX/sbin/criu" --version 2>/dev/null | head -1 || echo criu?), protobuf-c $(protoc-c --version 2>/dev/null | head -1 | awk '{print $2}'), CUDA at $CUDA_HOME"
