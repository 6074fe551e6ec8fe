#!/bin/sh
# Makes the three default kernels available, idempotently:
#   python3  /usr/bin/python3 with ipykernel, matplotlib, numpy, pandas and pip from Debian
#   deno     Deno's Jupyter kernel (JavaScript and TypeScript), from npm into .deps/
#   ir       R with IRkernel, from Debian (r-base-core, r-cran-irkernel)
# and writes their kernelspecs into .kernels/, which `make run` and the tests
# pass to kernelgate with --kernelspec-dir.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
deps="$root/.deps"
specs="$root/.kernels"
python=/usr/bin/python3
rbin=/usr/bin/R
irkernel=/usr/lib/R/site-library/IRkernel
deno_version=2.9.6

# Debian packages the Python kernel needs, as "module:package" pairs.
missing=""
for pair in ipykernel:python3-ipykernel matplotlib:python3-matplotlib numpy:python3-numpy pandas:python3-pandas pip:python3-pip; do
	mod=${pair%%:*}
	pkg=${pair#*:}
	if ! [ -x "$python" ] || ! "$python" -c "import $mod" >/dev/null 2>&1; then
		missing="$missing $pkg"
	fi
done
# R and IRkernel, for the ir kernel.
[ -x "$rbin" ] || missing="$missing r-base-core"
[ -f "$irkernel/DESCRIPTION" ] || missing="$missing r-cran-irkernel"
if [ -n "$missing" ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "installing Debian packages:$missing"
		apt-get update -q
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
	else
		echo "kernelgate needs these Debian packages for the Python and R kernels:$missing" >&2
		echo "install them with: sudo apt-get install --no-install-recommends$missing" >&2
		exit 1
	fi
fi

deno="$deps/node_modules/deno/deno"
if ! [ -x "$deno" ] || ! "$deno" --version 2>/dev/null | grep -q "^deno $deno_version "; then
	if ! command -v npm >/dev/null; then
		echo "kernelgate needs npm (Node.js) to install Deno; install nodejs and npm" >&2
		exit 1
	fi
	echo "installing deno $deno_version from npm into $deps"
	mkdir -p "$deps"
	[ -f "$deps/package.json" ] || echo '{"private": true}' >"$deps/package.json"
	npm install --prefix "$deps" --no-audit --no-fund --loglevel=error "deno@$deno_version"
fi

mkdir -p "$specs/python3" "$specs/deno"
for logo in logo-32x32.png logo-64x64.png logo-svg.svg; do
	if [ -f "/usr/share/jupyter/kernels/python3/$logo" ]; then
		cp "/usr/share/jupyter/kernels/python3/$logo" "$specs/python3/"
	fi
done
cat >"$specs/python3/kernel.json" <<JSON
{
  "argv": ["$python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
  "display_name": "Python 3 (ipykernel)",
  "language": "python",
  "interrupt_mode": "signal",
  "env": {"PYDEVD_DISABLE_FILE_VALIDATION": "1"},
  "metadata": {"debugger": true, "kernelgate": {"preload": ["numpy", "pandas", "matplotlib"]}}
}
JSON

# Deno writes its logos with --install; take them from a scratch data dir.
scratch=$(mktemp -d)
XDG_DATA_HOME="$scratch" "$deno" jupyter --install --force >/dev/null 2>&1 || true
cp "$scratch"/jupyter/kernels/deno/logo-* "$specs/deno/" 2>/dev/null || true
rm -rf "$scratch"
cat >"$specs/deno/kernel.json" <<JSON
{
  "argv": ["$deno", "jupyter", "--kernel", "--conn", "{connection_file}"],
  "display_name": "Deno",
  "language": "typescript",
  "interrupt_mode": "message",
  "env": {"DENO_NO_UPDATE_CHECK": "1", "DENO_NO_PROMPT": "1"}
}
JSON

# IRkernel's own kernelspec names "R" on PATH. This one names /usr/bin/R,
# and ignores a SIGINT that lands outside the code being run: IRkernel
# catches one only there, and one that came as a request was being set up
# (just after its execute_input) ended R. kernelgate interrupts again
# while the code runs on.
mkdir -p "$specs/ir"
for logo in logo-64x64.png logo-svg.svg; do
	if [ -f "$irkernel/kernelspec/$logo" ]; then
		cp "$irkernel/kernelspec/$logo" "$specs/ir/"
	fi
done
cat >"$specs/ir/kernel.json" <<JSON
{
  "argv": ["$rbin", "--slave", "-e", "withCallingHandlers(IRkernel::main(), interrupt = function(c) invokeRestart(\\"resume\\"))", "--args", "{connection_file}"],
  "display_name": "R",
  "language": "R",
  "interrupt_mode": "signal"
}
JSON
echo "kernels ready: $specs/python3 $specs/deno $specs/ir"
