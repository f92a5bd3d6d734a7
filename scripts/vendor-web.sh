#!/usr/bin/env bash
# Vendors the web page's two libraries from the npm registry into the package
# (src/turbospark/static/app/vendor/): the page fetches nothing at run time.
#   scripts/vendor-web.sh 18.3.0 3.5.0     (marked, dompurify)
set -euo pipefail
marked=${1:?marked version} purify=${2:?dompurify version}
dest=$(cd "$(dirname "$0")/.." && pwd)/src/turbospark/static/app/vendor
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
npm pack --silent "marked@$marked" "dompurify@$purify" >/dev/null
mkdir m p && tar xzf "marked-$marked.tgz" -C m && tar xzf "dompurify-$purify.tgz" -C p
sed '/sourceMappingURL/d' m/package/lib/marked.esm.js >"$dest/marked.esm.js"
sed '/sourceMappingURL/d' p/package/dist/purify.min.js >"$dest/purify.min.js"
cp m/package/LICENSE "$dest/LICENSE.marked.txt"
cp p/package/LICENSE "$dest/LICENSE.dompurify.txt"
echo "vendored marked $marked and DOMPurify $purify into $dest (update README.txt there)"
