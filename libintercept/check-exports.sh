#!/bin/sh
# Checks that a built shim exports exactly the driver's names and gpucr's
# own (gpucr-exports.list): every name in EXPORTS_LIST (from gen-forward.sh),
# defined, and nothing else.
#
#   check-exports.sh SHIM.so EXPORTS_LIST
set -eu

if [ $# -ne 2 ]; then
	echo "usage: $0 SHIM.so EXPORTS_LIST" >&2
	exit 2
fi
NM=${NM:-nm}
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

$NM -D --defined-only "$1" | awk 'NF == 3 { print $3 }' | LC_ALL=C sort -u > "$tmp"
if ! diff_out=$(LC_ALL=C comm -3 "$2" "$tmp"); then
	echo "$0: comm failed" >&2
	exit 1
fi
if [ -n "$diff_out" ]; then
	echo "$1 does not export exactly the driver's symbols and gpucr's own" >&2
	LC_ALL=C comm -23 "$2" "$tmp" | sed 's/^/  missing: /' | head -20 >&2
	LC_ALL=C comm -13 "$2" "$tmp" | sed 's/^/  extra:   /' | head -20 >&2
	exit 1
fi
