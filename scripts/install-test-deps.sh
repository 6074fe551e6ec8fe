#!/bin/sh
# What `make test` needs beyond the kernels, idempotently: the classic
# notebook, Jupyter Server, nbconvert and Chromium from Debian (the
# clients the end-to-end tests drive), bubblewrap for the sandbox tests,
# PostgreSQL's server for the --state-url tests (run privately by
# internal/pgtest), and the npm packages of e2e/ and web/.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)

missing=""
/usr/bin/python3 -c "import notebook" >/dev/null 2>&1 || missing="$missing jupyter-notebook python3-notebook"
/usr/bin/python3 -c "import jupyter_server" >/dev/null 2>&1 || missing="$missing python3-jupyter-server"
/usr/bin/python3 -c "import nbconvert" >/dev/null 2>&1 || missing="$missing python3-nbconvert"
[ -x /usr/bin/chromium ] || missing="$missing chromium"
[ -x /usr/bin/bwrap ] || missing="$missing bubblewrap"
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$missing postgresql-15"
if [ -n "$missing" ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "installing Debian packages:$missing"
		apt-get update -q
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
	else
		echo "the tests need these Debian packages:$missing" >&2
		echo "install them with: sudo apt-get install --no-install-recommends$missing" >&2
		exit 1
	fi
fi

for dir in "$root/e2e" "$root/web"; do
	[ -f "$dir/package-lock.json" ] || continue
	# npm ci only when the lockfile changed since the last install.
	stamp="$dir/node_modules/.kernelgate-lock"
	if ! [ -f "$stamp" ] || ! cmp -s "$dir/package-lock.json" "$stamp"; then
		echo "installing npm packages in $dir"
		(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
		cp "$dir/package-lock.json" "$stamp"
	fi
done
