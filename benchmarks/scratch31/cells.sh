#!/bin/bash
# usage: FOCUS_SEL=... cells.sh  -> diag on key cells (ratio lines only)
cd "$(dirname "$0")/../.."
for cell in "truncated 6 biased" "truncated 2 noise_3" "truncated 6 noise_1" "truncated 6 noise_3" "decisive 6 noise_3" "decisive 6 noise_1" "heavy_tail 6 constant" "heavy_tail 6 noise_1" "truncated 6 constant" "decisive 6 constant"; do
  set -- $cell; s=22; [ $2 = 2 ] && s=64
  PYTHONPATH=. .venv/bin/python benchmarks/scratch31/diag.py $1 $2 $3 $s 2>&1 | head -1
done
