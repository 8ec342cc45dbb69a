#!/usr/bin/env bash
# Times the phases of `make build`/`make test`/`make demo`, so each change sees what it costs:
#   scripts/phase.sh NAME COMMAND...   runs COMMAND, appends "NAME<TAB>SECONDS<TAB>EXIT<TAB>START<TAB>END"
#                                      to $TRAINBOOK_PHASES
#   scripts/phase.sh --report          prints the phases recorded so far as a table, with the wall
#                                      time from the first start to the last end (a failing phase
#                                      prints it too)
# TRAINBOOK_PHASES (set by the Makefile for each make run) names the file; without it, phases
# are run but not recorded.
set -uo pipefail
file=${TRAINBOOK_PHASES:-}
if [ "${1:-}" = --report ]; then
  [ -n "$file" ] && [ -s "$file" ] || exit 0
  # The total is wall time, first start to last end: phases that ran side by side (the torch
  # pairs beside pytest) count once.
  awk -F'\t' '
    { n[NR] = $1; s[NR] = $2; e[NR] = $3; sum += $2
      if (NF >= 5) { if (first == "" || $4 < first) first = $4; if ($5 > last) last = $5 } }
    END {
      total = (first != "") ? last - first : sum
      printf "\n%-28s %9s  %s\n", "phase", "time", "exit"
      for (i = 1; i <= NR; i++) printf "%-28s %6dm%02ds  %s\n", n[i], s[i] / 60, s[i] % 60, e[i]
      printf "%-28s %6dm%02ds\n", "total (wall)", total / 60, total % 60
    }' "$file" >&2
  exit 0
fi
name=${1:?usage: phase.sh NAME COMMAND...}; shift
start=$(date +%s)
"$@"
rc=$?
if [ -n "$file" ]; then
  mkdir -p "$(dirname "$file")"
  end=$(date +%s)
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$(( end - start ))" "$rc" "$start" "$end" >> "$file"
  # make stops at a failing phase: show what ran until then.
  [ "$rc" = 0 ] || "$0" --report
fi
exit $rc
