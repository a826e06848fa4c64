#!/usr/bin/env bash
# Packs the npm packages as they would be published: @ruvector/ruvllm (JS loader, types, CLI) and
# @ruvector/ruvllm-linux-x64-gnu with the built addon inside (copied into npm/linux-x64-gnu/, as
# `napi artifacts` does). Usage: scripts/pack.sh [out-dir]  (default: a new temp dir).
# Prints the two tarballs' paths, main package first. Build the addon first (npm run build).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
addon=ruvllm.linux-x64-gnu.node
platform_dir="$root/npm/linux-x64-gnu"
out="${1:-$(mktemp -d "${TMPDIR:-/tmp}/ruvllm-pack.XXXXXX")}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

[ -f "$root/$addon" ] || { echo "pack: $root/$addon is missing: build it first (npm run build)" >&2; exit 1; }

# The main package's version, the platform package's and the optionalDependencies entry must agree.
node -e '
  const [main, plat] = process.argv.slice(1).map((p) => require(p))
  const want = (main.optionalDependencies || {})[plat.name]
  if (main.version !== plat.version || want !== plat.version) {
    console.error(`pack: versions disagree: ${main.name}@${main.version}, ${plat.name}@${plat.version}, optionalDependencies["${plat.name}"] = ${want}`)
    process.exit(1)
  }
  if (Object.keys(main.dependencies || {}).length) {
    console.error(`pack: ${main.name} must have no runtime dependencies, has ${Object.keys(main.dependencies)}`)
    process.exit(1)
  }
' "$root/package.json" "$platform_dir/package.json"

cp "$root/$addon" "$platform_dir/$addon"
main_tgz="$(cd "$root" && npm pack --silent --pack-destination "$out" | tail -n 1)"
platform_tgz="$(cd "$platform_dir" && npm pack --silent --pack-destination "$out" | tail -n 1)"
echo "$out/$main_tgz"
echo "$out/$platform_tgz"
