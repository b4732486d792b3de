#!/usr/bin/env bash
# `make install`: binaries, the driver shim in gpucr's own lib dir (never in
# the system's library path: applications get it only through `gpucr run` or
# LD_LIBRARY_PATH), the CRIU plugin in CRIU's plugin dir, systemd units.
set -euo pipefail
BUILD=${BUILD:-build}
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
CRIU_PLUGINDIR=${CRIU_PLUGINDIR:-/usr/lib/criu}
bindir=$DESTDIR$PREFIX/bin
libdir=$DESTDIR$PREFIX/lib/gpucr
unitdir=$DESTDIR$PREFIX/lib/systemd/system

install -d "$bindir" "$libdir" "$unitdir" "$DESTDIR$PREFIX/share/doc/gpucr"
for f in gpucr gpucrd cuda-checkpoint; do
	[ -x "$BUILD/bin/$f" ] && install -m 0755 "$BUILD/bin/$f" "$bindir/$f"
done
if [ -f "$BUILD/lib/gpucr/libcuda.so.1" ]; then
	install -m 0755 "$BUILD/lib/gpucr/libcuda.so.1" "$libdir/libcuda.so.1"
	ln -sf libcuda.so.1 "$libdir/libcuda.so"
fi
if [ -f "$BUILD/lib/criu/gpucr_plugin.so" ]; then
	install -d "$DESTDIR$CRIU_PLUGINDIR"
	install -m 0644 "$BUILD/lib/criu/gpucr_plugin.so" "$DESTDIR$CRIU_PLUGINDIR/gpucr_plugin.so"
fi
sed "s|@BINDIR@|$PREFIX/bin|g" systemd/gpucrd.service >"$unitdir/gpucrd.service"
install -m 0644 systemd/gpucrd.socket "$unitdir/gpucrd.socket"
install -m 0644 README.md "$DESTDIR$PREFIX/share/doc/gpucr/README.md"
echo "installed gpucr under $DESTDIR$PREFIX (CRIU plugin dir $DESTDIR$CRIU_PLUGINDIR)"
