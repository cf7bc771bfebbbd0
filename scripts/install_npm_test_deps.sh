#!/usr/bin/env bash
# Installs the npm packages that google_clients_test drives the controller
# with (Google's two Node.js clients of the Cloud TPU API), at pinned
# versions, into a cache outside the repository:
#   ${MULTISLICE_NPM_CACHE:-$HOME/.cache/multislice/npm-test}/node_modules
# No package.json or package-lock.json is written into the repository.
# Returns at once when those versions are already installed. Safe to run
# again; --force reinstalls.
set -euo pipefail

packages=(googleapis@188.0.0 @google-cloud/tpu@3.8.1)
dir="${MULTISLICE_NPM_CACHE:-$HOME/.cache/multislice/npm-test}"
stamp="$dir/installed.txt"
want="${packages[*]}"

if [ "${1:-}" != "--force" ] && [ -f "$stamp" ] &&
   [ "$(head -n 1 "$stamp")" = "$want" ] && [ -d "$dir/node_modules" ]; then
  exit 0
fi
for tool in node npm; do
  command -v "$tool" >/dev/null || {
    echo "install_npm_test_deps: '$tool' not found; google_clients_test" \
         "needs Node.js 18 or later with npm" >&2
    exit 1
  }
done

echo "install_npm_test_deps: installing ${want} into ${dir}"
mkdir -p "$dir"
rm -f "$stamp"
# A package.json of the cache's own, so that npm installs there and not in
# the repository that called it.
cat >"$dir/package.json" <<JSON
{"name": "multislice-npm-test", "private": true,
 "description": "npm packages of multislice's google_clients_test"}
JSON
(cd "$dir" && npm install --no-package-lock --no-save --no-audit --no-fund \
  --loglevel=error "${packages[@]}")
# The stamp: what was asked, then what each package resolved to.
{
  echo "$want"
  (cd "$dir" && node -e '
    for (const p of ["googleapis", "@google-cloud/tpu", "google-gax",
                     "google-auth-library"]) {
      try {
        console.log(p + "@" + require(p + "/package.json").version);
      } catch (e) {}
    }')
} >"$stamp.tmp"
mv "$stamp.tmp" "$stamp"
sed -n '2,$p' "$stamp" | sed 's/^/install_npm_test_deps: /'
