#!/bin/sh
# Rebuilds web/dist (the bundle go:embed serves) from web/src.
# Needs Node.js 20+ and npm; `go build` does not, since web/dist is committed.
set -eu
cd "$(dirname "$0")"
npm ci --no-audit --no-fund --loglevel=error
npx --no-install tsc --noEmit -p .
node build.mjs
