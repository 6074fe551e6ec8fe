#!/bin/sh
# Installs Debian's Jupyter Server, the comparison of make bench, when it is
# missing (apt-get as root; otherwise says what to install).
set -eu
if /usr/bin/python3 -c "import jupyter_server" >/dev/null 2>&1; then
	exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
	echo "installing Debian's python3-jupyter-server for the benchmarks"
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-jupyter-server
else
	echo "make bench compares kernelgate with Debian's Jupyter Server; install it with:" >&2
	echo "  sudo apt-get install --no-install-recommends python3-jupyter-server" >&2
	exit 1
fi
