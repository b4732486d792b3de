#!/usr/bin/env bash
# Builds a self-contained gpucr bundle for GPU hosts that have no build tools
# and none of liburing, libuv, protobuf-c or CRIU:
#
#   $BUILD/bundle/gpucr-$VERSION/        the folder
#   $BUILD/bundle/gpucr-$VERSION.tar.gz  the same, as a tarball
#
# gpucr's executables carry liburing and libuv statically and protobuf-c's
# runtime compiled in; CRIU is copied with the non-glibc shared libraries it
# needs (found with ldd) and an rpath pointing at them. `bin/criu` is a
# wrapper that points CRIU at the bundle's plugin dir; `env.sh` puts the
# bundle first on PATH. Only glibc (2.36 or newer) is needed on the host.
set -euo pipefail

BUILD=${BUILD:-build}
VERSION=${VERSION:?VERSION not set}
DEPS_PREFIX=${DEPS_PREFIX:-/usr/local}
name=gpucr-$VERSION
out=$BUILD/bundle/$name

die() { printf 'bundle: error: %s\n' "$*" >&2; exit 1; }

criu=$DEPS_PREFIX/sbin/criu
[ -x "$criu" ] || criu=$(command -v criu || true)
[ -x "$criu" ] || die "criu not found: run scripts/install-deps.sh"
command -v patchelf >/dev/null || die "patchelf not found: run scripts/install-deps.sh"

rm -rf "$out" "$out.tar.gz"
mkdir -p "$out"/{bin,libexec/criu,lib/gpucr,lib/criu,lib/criu-stock,lib/criu-deps,share/gpucr}

# gpucr's own programs and libraries (whatever the build produced).
for f in gpucr gpucrd cuda-checkpoint imgbench; do
	[ -x "$BUILD/bin/$f" ] && install -m 0755 "$BUILD/bin/$f" "$out/bin/$f"
done
# shimcost (nvcc, gpu-progs); its script and torch_launches.py go to share/gpucr/bench below
# (the script also runs tests/gpu/cuda-prog --counts, copied with the GPU suite).
[ -x "$BUILD/bin/shimcost" ] && install -m 0755 "$BUILD/bin/shimcost" "$out/bin/shimcost"
[ -f "$BUILD/lib/gpucr/libcuda.so.1" ] && install -m 0755 "$BUILD/lib/gpucr/libcuda.so.1" "$out/lib/gpucr/"
[ -f "$BUILD/lib/criu/gpucr_plugin.so" ] &&
	install -m 0644 "$BUILD/lib/criu/gpucr_plugin.so" "$out/lib/criu/"

# CRIU, its shared libraries except glibc's own, and its stock cuda plugin
# (kept in a separate plugin dir: the benchmarks' baseline).
install -m 0755 "$criu" "$out/libexec/criu/criu"
ldd "$criu" | awk '/=> \// { print $3 }' | while read -r lib; do
	case $(basename "$lib") in
	libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*) continue ;;
	esac
	cp -L "$lib" "$out/lib/criu-deps/"
done
# DT_RPATH, not DT_RUNPATH: it must also serve the libraries' own needs
# (libidn2 -> libunistring), which RUNPATH does not.
patchelf --force-rpath --set-rpath '$ORIGIN/../../lib/criu-deps' "$out/libexec/criu/criu"
stock=$DEPS_PREFIX/lib/gpucr-deps/criu-stock-plugins/cuda_plugin.so
[ -f "$stock" ] && install -m 0644 "$stock" "$out/lib/criu-stock/"

cat >"$out/bin/criu" <<'WRAP'
#!/bin/sh
# CRIU from the gpucr bundle. Plugins come from the bundle's lib/criu (gpucr's
# plugin) unless CRIU_LIBS_DIR or -L/--libdir says otherwise.
here=$(cd "$(dirname "$0")/.." && pwd)
CRIU_LIBS_DIR=${CRIU_LIBS_DIR:-$here/lib/criu}
export CRIU_LIBS_DIR
exec "$here/libexec/criu/criu" "$@"
WRAP
chmod 0755 "$out/bin/criu"

cat >"$out/env.sh" <<'ENV'
# Source this file: puts the gpucr bundle first on PATH.
GPUCR_BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)
export GPUCR_BUNDLE
export PATH="$GPUCR_BUNDLE/bin:$PATH"
ENV

# The tests and benchmarks that run on a GPU host from the bundle.
if [ -d "$BUILD/tests" ]; then
	mkdir -p "$out/tests"
	find "$BUILD/tests" -maxdepth 1 -type f -perm -u+x -exec cp {} "$out/tests/" \;
	if [ -d "$BUILD/tests/gpu" ]; then
		mkdir -p "$out/tests/gpu"
		find "$BUILD/tests/gpu" -maxdepth 1 -type f -perm -u+x -exec cp {} "$out/tests/gpu/" \;
	fi
fi
[ -f "$BUILD/fakecuda/libcuda.so.1" ] && mkdir -p "$out/lib/fakecuda" &&
	cp "$BUILD/fakecuda/libcuda.so.1" "$out/lib/fakecuda/"
for d in tests/gpu tests/e2e bench scripts; do
	[ -d "$d" ] || continue
	mkdir -p "$out/share/gpucr/$d"
	find "$d" -maxdepth 1 -type f \( -name '*.sh' -o -name '*.bash' -o -name '*.py' -o -name '*.cu' -o -name '*.c' \) \
		-exec cp {} "$out/share/gpucr/$d/" \;
done
cp tests/run-tests.sh "$out/share/gpucr/tests/"
echo "$VERSION" >"$out/VERSION"

tar -C "$BUILD/bundle" -czf "$out.tar.gz" "$name"
printf 'bundle: %s (%s)\n' "$out" "$(du -sh "$out.tar.gz" | cut -f1) as $out.tar.gz"
"$out/bin/criu" --version | head -1 | sed 's/^/bundle: criu /'
