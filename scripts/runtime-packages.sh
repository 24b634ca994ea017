#!/usr/bin/env bash
# Prints, one a line, the Debian packages that own the shared libraries an
# installed lockstep (PREFIX/bin, PREFIX/lib) loads: what a runtime-only image
# installs (Containerfile). Found with ldd and dpkg, so the list follows the
# base image's package names (Debian 12, Ubuntu 24.04, the CUDA images).
# Usage: scripts/runtime-packages.sh PREFIX
set -euo pipefail
prefix=${1:?usage: runtime-packages.sh PREFIX}
mapfile -t objects < <(find "$prefix/bin" "$prefix/lib" -maxdepth 1 -type f \
  \( -perm -u+x -o -name '*.so*' \))
[ ${#objects[@]} -gt 0 ] || { echo "runtime-packages: nothing installed under $prefix" >&2; exit 1; }

# owner FILE: the package that installed FILE (matched by its name, since ldd
# may print /lib/... where dpkg recorded /usr/lib/...).
owner() {
  { dpkg -S "*/$(basename "$1")" 2>/dev/null || true; } |
    awk -v name="/$(basename "$1")" 'substr($NF, length($NF) - length(name) + 1) == name && !found {
      sub(/:.*/, "", $1); found = $1 } END { print found }'
}

# lockstep's own libraries resolve to PREFIX/lib, rpath or not, and are skipped.
LD_LIBRARY_PATH=$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ldd "${objects[@]}" |
  awk '$2 == "=>" { print $1, $3 }' | sort -u |
  while read -r soname path; do
    case $path in
      "$prefix"/*) continue ;;
      not)
        # The GPU driver's library comes from the host at run time.
        [ "$soname" = libcuda.so.1 ] && continue
        echo "runtime-packages: $soname, loaded by lockstep, is not found" >&2
        exit 1
        ;;
    esac
    package=$(owner "$path")
    [ -n "$package" ] || package=$(owner "$(readlink -f "$path")")
    [ -n "$package" ] || { echo "runtime-packages: no package owns $path" >&2; exit 1; }
    echo "$package"
  done | sort -u
