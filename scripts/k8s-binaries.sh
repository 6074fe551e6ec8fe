#!/bin/sh
# Builds the kube-apiserver and etcd that the Kubernetes tests run against,
# from the wrapper module internal/k8stest/controlplane, once per machine:
# the binaries go to a cache outside the checkout keyed by the wrapper's
# go.sum, so every clone on the machine reuses them. A cold build takes
# about 6 minutes of both cores and 2.5 GB of memory; a warm run returns at
# once. Prints the folder that holds the two binaries.
#
#   scripts/k8s-binaries.sh          build if missing, print the folder
#   scripts/k8s-binaries.sh --dir    print the folder only, build nothing
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
wrapper="$root/internal/k8stest/controlplane"
GO=${GO:-$(command -v go 2>/dev/null || echo /usr/local/go/bin/go)}

key=$(sha256sum "$wrapper/go.sum" | cut -c1-16)
cache="${XDG_CACHE_HOME:-$HOME/.cache}/kernelgate/k8s"
dir="$cache/$key"

if [ "${1:-}" = --dir ]; then
	echo "$dir"
	exit 0
fi
if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ]; then
	echo "$dir"
	exit 0
fi

mkdir -p "$cache"
# One build at a time on the machine: a second caller waits for the first
# and then finds the binaries.
exec 9>"$cache/.lock"
flock 9
if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ]; then
	echo "$dir"
	exit 0
fi

tmp=$(mktemp -d "$cache/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$wrapper"
version=$("$GO" list -m -f '{{.Version}}' k8s.io/kubernetes)
major=$(echo "$version" | sed 's/^v\([0-9]*\)\..*/\1/')
minor=$(echo "$version" | sed 's/^v[0-9]*\.\([0-9]*\)\..*/\1/')
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
start=$(date +%s)
echo "building kube-apiserver $version and etcd into $dir (cold: about 6 minutes)" >&2
CGO_ENABLED=0 "$GO" build -mod=readonly -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
CGO_ENABLED=0 "$GO" build -mod=readonly -trimpath -ldflags "$ldflags" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
"$tmp/kube-apiserver" --version >&2
"$tmp/etcd" --version >&2
mkdir -p "$dir"
mv "$tmp/etcd" "$tmp/kube-apiserver" "$dir/"
echo "built in $(($(date +%s) - start)) s" >&2
echo "$dir"
