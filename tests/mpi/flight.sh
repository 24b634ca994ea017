#!/bin/bash
# Runs a fault of lockstep_mpi_faults that ends the job with the watchdog,
# with LOCKSTEP_FLIGHT_DIR in a fresh directory, then tools/flight.py on the
# dumps left there, and checks the job's exit status (70) and that the
# tool's report matches every expected regex (grep -E).
#   flight.sh <flight.py> <regex>... -- <mpiexec command line>
set -u
tool=$1
shift
regexes=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  regexes+=("$1")
  shift
done
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
LOCKSTEP_FLIGHT_DIR=$dir timeout 60 "$@"
status=$?
echo "-- exit status: $status"
failed=0
if [ "$status" -ne 70 ]; then
  echo "FAIL: exit status $status, expected 70 (the watchdog's abort)"
  failed=1
fi
ls "$dir"
report=$(python3 "$tool" "$dir")
echo "-- flight.py $dir:"
echo "$report"
for regex in "${regexes[@]}"; do
  if ! grep -Eq -- "$regex" <<<"$report"; then
    echo "FAIL: no match for '$regex' in the report"
    failed=1
  fi
done
exit $failed
