#!/usr/bin/env bash
# Builds ngx_http_sluice_module as a dynamic module for the NGINX that Debian ships, and
# prints the path of the .so. Needs Debian's `nginx-dev` (the configure scripts, headers and
# the exact configure flags of Debian's build in /usr/share/nginx/src/conf_flags); installs
# nothing. The module is built with those flags plus --with-compat, so `load_module` accepts
# it in Debian's `nginx`.
#
#   nginx/build.sh [OUT_DIR]      default OUT_DIR: target/nginx (in the repository)
#
# The NGINX sources are copied to OUT_DIR/src (never built in the package-owned
# /usr/share/nginx/src); a rebuild reuses that copy and recompiles only what changed.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
src=/usr/share/nginx/src
out="$(mkdir -p "${1:-$here/../target/nginx}" && cd "${1:-$here/../target/nginx}" && pwd)"

if [ ! -f "$src/conf_flags" ]; then
  echo "build.sh: $src/conf_flags not found; install Debian's nginx-dev (apt-get install nginx-dev)" >&2
  exit 1
fi

# A copy per NGINX version: a stale one from another version would build a module that
# `load_module` refuses.
version="$(sed -n 's/^#define NGINX_VERSION *"\(.*\)"/\1/p' "$src/src/core/nginx.h")"
build="$out/src-$version"
if [ ! -f "$build/objs/Makefile" ] || [ "$here/config" -nt "$build/objs/Makefile" ]; then
  rm -rf "$build"
  cp -r "$src" "$build"
  (
    cd "$build"
    # shellcheck disable=SC1091
    source ./conf_flags
    flags=("${NGX_CONF_FLAGS[@]}")
    case " ${flags[*]} " in *" --with-compat "*) ;; *) flags+=(--with-compat) ;; esac
    ./configure "${flags[@]}" --add-dynamic-module="$here" >"$out/configure.log" 2>&1 \
      || { echo "build.sh: configure failed, see $out/configure.log" >&2; exit 1; }
  )
fi

make -s -C "$build" -f objs/Makefile modules >"$out/make.log" 2>&1 \
  || { cat "$out/make.log" >&2; echo "build.sh: make failed" >&2; exit 1; }
grep -i "warning" "$out/make.log" >&2 || true

cp "$build/objs/ngx_http_sluice_module.so" "$out/ngx_http_sluice_module.so"
echo "$out/ngx_http_sluice_module.so"
