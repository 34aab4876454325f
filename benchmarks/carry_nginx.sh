#!/usr/bin/env bash
# Bundles this machine's nginx, its lua module (the pacing of benchmarks/remote_compare.py), the
# lua libraries that module loads and every shared library they need, the dynamic loader
# included, into .carry/nginx, so that the GPU machines (which have no nginx) run the same server:
# remote_compare.py starts it as `lib/ld-linux-x86-64.so.2 --library-path lib sbin/nginx`.
#   bash benchmarks/carry_nginx.sh        (about 10 MB; `make gpu-nginx`)
set -euo pipefail
out=${1:-.carry/nginx}
nginx=$(command -v nginx || echo /usr/sbin/nginx)
modules=(/usr/lib/nginx/modules/ndk_http_module.so /usr/lib/nginx/modules/ngx_http_lua_module.so)
for f in "$nginx" "${modules[@]}"; do
  [ -e "$f" ] || { echo "missing $f (apt-get install nginx libnginx-mod-http-lua)" >&2; exit 1; }
done
rm -rf "$out" && mkdir -p "$out/sbin" "$out/lib" "$out/modules" "$out/lua"
cp "$nginx" "$out/sbin/nginx"
cp "${modules[@]}" "$out/modules/"
# Every library the binary and the modules load, by their sonames, the loader too.
ldd "$nginx" "${modules[@]}" | awk '/=> \//{print $3} /^\s*\/.*ld-linux/{print $1}' | sort -u |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
cp -L /lib64/ld-linux-x86-64.so.2 "$out/lib/"
cp -r /usr/share/lua/5.1/. "$out/lua/"
"$out/lib/ld-linux-x86-64.so.2" --library-path "$out/lib" "$out/sbin/nginx" -v
du -sh "$out"
