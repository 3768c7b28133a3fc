# pveclean: `make demo` shows the main job in a lab container, `make test` runs everything.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: all test demo bench soak lint venv lab-deps gpu-check deb deb-build-deps deb-check clean

all: test

# editable_mode=compat: a plain path in a .pth file. setuptools' default for this layout is an
# import hook that imports pathlib and more into every interpreter of the venv (16 ms here),
# which would also pad the bare `python3 -c pass` that `make bench` compares start-up with.
$(BIN)/pveclean: pyproject.toml Makefile
	@$(PY) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "pveclean needs Python 3.11+")'
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test]' --config-settings editable_mode=compat
	@touch $@

venv: $(BIN)/pveclean

# The lab needs LXC, a static busybox and a C compiler with a static libc; the monitoring tests
# Prometheus (its promtool too: Debian's prometheus package ships it) and node_exporter. As root,
# install what is missing (Debian/Proxmox package names); otherwise those tests skip with a
# reason. Their services are not started here (the tests start their own on loopback ports).
lab-deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  missing=""; \
	  command -v lxc-start >/dev/null 2>&1 || missing="$$missing lxc"; \
	  [ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 || missing="$$missing busybox-static"; \
	  command -v gcc >/dev/null 2>&1 || missing="$$missing gcc"; \
	  [ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -e /usr/lib/aarch64-linux-gnu/libc.a ] || missing="$$missing libc6-dev"; \
	  command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	  command -v prometheus-node-exporter >/dev/null 2>&1 || missing="$$missing prometheus-node-exporter"; \
	  if [ -n "$$missing" ]; then \
	    echo "installing lab packages:$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing >/dev/null \
	    || { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing >/dev/null; }; \
	  fi; \
	fi

# ruff, mypy, the layers' import rules (tests/unit/test_layers.py) and the typing rules
# (tests/unit/test_typing_rules.py: dict[str, Any] only at the edge, no parsing of pveclean's own
# text, no function over 60 lines or 7 parameters, Any capped), then the counts they keep
lint: venv
	$(BIN)/ruff check pveclean tests packaging
	$(BIN)/mypy
	$(BIN)/mypy tests/unit/test_layers.py tests/unit/test_typing_rules.py tests/typing_counts.py
	$(BIN)/pytest -q -p no:cacheprovider tests/unit/test_layers.py tests/unit/test_typing_rules.py
	$(BIN)/python -m tests.typing_counts --summary

test: lab-deps venv lint
	$(BIN)/pytest $(PYTEST_ARGS)

demo: lab-deps venv
	$(BIN)/python -m tests.harness.demo

bench: lab-deps venv
	$(BIN)/python -m tests.bench.run

soak: lab-deps venv
	$(BIN)/python -m tests.soak --cycles $(or $(CYCLES),100)

gpu-check: venv
	$(BIN)/python tests/gpu/gpu_check.py $(GPU_CHECK_ARGS)

# dist/pveclean_<version>_all.deb, for Proxmox VE 8 and 9, built the Debian way from debian/
# with Debian's packages only (no venv, nothing from PyPI: debian/vendor/README). As root, the
# build dependencies are installed with apt first. Debian's own python3 builds it, whatever
# python3 comes first on PATH.
DEB_PATH := /usr/sbin:/usr/bin:/sbin:/bin

deb-build-deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  if ! PATH=$(DEB_PATH) dpkg-checkbuilddeps >/dev/null 2>&1; then \
	    echo "installing the build dependencies of debian/control"; \
	    DEBIAN_FRONTEND=noninteractive apt-get build-dep -y -q ./ >/dev/null \
	    || { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get build-dep -y -q ./ >/dev/null; }; \
	  fi; \
	fi

deb: deb-build-deps
	env PATH=$(DEB_PATH) dpkg-buildpackage -us -uc -b
	mkdir -p dist
	v=$$(dpkg-parsechangelog -S Version) && a=$$(dpkg --print-architecture) && \
	  mv ../pveclean_$${v}_all.deb ../pveclean_$${v}_$${a}.buildinfo ../pveclean_$${v}_$${a}.changes dist/ && \
	  ls -l dist/pveclean_$${v}_all.deb

# As root: the source package built in debootstrapped bookworm and trixie roots (cached in
# /var/cache/pveclean-deb-check) with Debian's build dependencies only, lintian on it; the
# .deb installed there with apt, upgraded, removed and purged; a bookworm root with it upgraded
# to trixie. Needs no venv.
deb-check:
	$(PY) packaging/deb_check.py

clean:
	rm -rf $(VENV) build dist *.egg-info tests/harness/build .mypy_cache .ruff_cache .pytest_cache
	rm -rf .pybuild debian/.debhelper debian/pveclean debian/generated debian/files debian/*.substvars \
	  debian/*.debhelper.log debian/debhelper-build-stamp
