#!/bin/sh
# Turns a PTX file into a C array definition: embed-ptx.sh NAME IN.ptx > OUT.c
set -e
name=$1
in=$2
echo "/* Generated from $in by daemon/embed-ptx.sh. */"
echo "const char ${name}[] ="
sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/\t"/' -e 's/$/\\n"/' "$in"
echo ";"
