#!/usr/bin/env bash
# The package tree carried in .old (git archive REF mvdb kernels storage | tar -x -C .old) as the
# package mvdb_old under $1 (default /tmp/oldpk), so one process can import both versions and
# time them in alternating rounds (benchmarks/train_host.py --paired --old mvdb_old).
set -euo pipefail
DEST=${1:-/tmp/oldpk}
rm -rf "$DEST" && mkdir -p "$DEST"
cp -r .old/mvdb "$DEST/mvdb_old" && cp -r .old/kernels "$DEST/mvdb_old/kernels" && cp -r .old/storage "$DEST/mvdb_old/storage"
find "$DEST/mvdb_old" -name '*.py' -print0 | xargs -0 sed -i -E \
    -e 's/^(\s*)from mvdb([. ])/\1from mvdb_old\2/' -e 's/^(\s*)import mvdb(\.|$| )/\1import mvdb_old\2/' \
    -e 's/"mvdb\.(kernels|storage|engine|serve|database|encoders|api)/"mvdb_old.\1/g' -e 's/__import__\("mvdb"\)/__import__("mvdb_old")/'
