# shardkeeper: two commands do all the set-up on a fresh machine.
#   make demo   - install what the demo's store needs (BACKEND=etcd, the default: etcd
#                 only; BACKEND=zookeeper: ZooKeeper and a JRE), run the demo on it
#   make test   - install what is missing, run ruff, mypy and the test suite
#   make test-fast   - the tests that need no server (-m "not external_service"): no root,
#                      no system packages
#   make test-latest - the fast tier on the newest releases of every dependency, kazoo and
#                      cslab-etcd3 included (past pyproject's ranges), in its own venv
#   make test-versions - the fast tier on the other supported Pythons (3.12, 3.13, from
#                      pyenv), each in its own venv; the full suite runs on 3.11 (make test)
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
BACKEND ?= etcd
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# the suite mostly waits on real servers (session timeouts, processes): two xdist
# workers halve its time on 2 cores; the CPU-heavy tests share one worker (xdist_group)
PYTEST_WORKERS ?= 2

# the newest releases, for make test-latest (never the venv make test uses)
LATEST_VENV ?= .venv-latest
FAST_MARK := not external_service
# the package with every extra and the dev dependency group (PEP 735; pip >= 25.1)
INSTALL_DEV := -e '.[all]' --group dev
# the other Pythons of pyproject's classifiers, for make test-versions (pyenv's builds)
OTHER_PYTHONS ?= 3.12 3.13
PYENV_ROOT ?= $(HOME)/.pyenv

.PHONY: demo test test-fast test-latest test-versions lint typecheck typecheck-tests pytest system-deps demo-deps demo-venv venv chaos bench clean registry-up registry-down

demo: demo-deps demo-venv
	$(PY) -m demo --backend $(BACKEND)

test: system-deps venv lint typecheck typecheck-tests pytest

lint: venv
	$(VENV)/bin/ruff check src tests examples demo bench
	$(VENV)/bin/ruff format --check src tests examples demo bench
	$(VENV)/bin/lint-imports

typecheck: venv
	$(VENV)/bin/mypy

# the tests under the same strict mypy (check_untyped_defs included); part of make test
typecheck-tests: venv
	$(VENV)/bin/mypy --explicit-package-bases tests

pytest: system-deps venv
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# the fast tier: what a contributor can run anywhere (docs/testing.md)
test-fast: venv
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup -m "$(FAST_MARK)" $(PYTEST_ARGS)

# The fast tier on the newest releases, without constraints.txt: the kazoo and etcd3
# releases that pyproject's ranges do not admit yet are installed over them (pip warns
# of the conflict), so tests/registry/test_client_privates.py tells what a new client
# release broke before the range is widened.
test-latest:
	rm -rf $(LATEST_VENV)
	python3 -m venv $(LATEST_VENV)
	$(LATEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(LATEST_VENV)/bin/python -m pip install -q --upgrade --upgrade-strategy eager $(INSTALL_DEV)
	$(LATEST_VENV)/bin/python -m pip install -q --upgrade kazoo cslab-etcd3
	$(LATEST_VENV)/bin/python -m pip list 2>/dev/null | grep -iE '^(kazoo|cslab-etcd3|grpcio|protobuf|apscheduler) '
	$(LATEST_VENV)/bin/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup -m "$(FAST_MARK)" $(PYTEST_ARGS)

# The fast tier on each of OTHER_PYTHONS, at the tested versions (constraints.txt), in
# .venv-3.12 and so on (made once; rm one to rebuild it). The interpreter is pyenv's
# newest build of that minor version, else python3.12 and so on from the PATH.
test-versions:
	@set -e; for v in $(OTHER_PYTHONS); do \
	  py=$$(ls -d $(PYENV_ROOT)/versions/$$v.*/bin/python 2>/dev/null | sort -V | tail -1); \
	  [ -n "$$py" ] || py=$$(command -v python$$v) || { echo "no Python $$v (pyenv install $$v)"; exit 1; }; \
	  venv=.venv-$$v; echo "== Python $$v: $$py ($$venv)"; \
	  if [ ! -f $$venv/.installed ] || [ pyproject.toml -nt $$venv/.installed ] || [ constraints.txt -nt $$venv/.installed ]; then \
	    [ -x $$venv/bin/python ] || $$py -m venv $$venv; \
	    $$venv/bin/python -m pip install -q --upgrade 'pip>=25.1'; \
	    $$venv/bin/python -m pip install -q -c constraints.txt $(INSTALL_DEV); \
	    touch $$venv/.installed; \
	  fi; \
	  $$venv/bin/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup -m "$(FAST_MARK)" $(PYTEST_ARGS); \
	done

chaos: system-deps venv
	$(PY) -m pytest -q tests/chaos --chaos-duration $${DURATION:-600} -m chaos $(if $(STORE),-k '$(STORE)',)

bench: system-deps venv
	$(VENV)/bin/pip install -q -c constraints.txt --group bench
	$(PY) -m bench $(if $(QUICK),--quick,)

# One check per system package: each adds the package to $missing (installed with its
# recommended packages) or $bare (without them) when what it provides is absent. Kept
# recursive (=) so that $$ reaches the shell as $.
CHECK_ZOOKEEPER = [ -f /usr/share/java/zookeeper.jar ] || [ -n "$$SHARDKEEPER_ZOOKEEPER_HOME$$SHARDKEEPER_ZOOKEEPER_JAR$$ZOOKEEPER_HOME" ] || command -v zkServer.sh >/dev/null || missing="$$missing zookeeper";
CHECK_JAVA = command -v java >/dev/null || [ -n "$$JAVA_HOME" ] || missing="$$missing default-jre-headless";
CHECK_ETCD = command -v etcd >/dev/null || [ -n "$$SHARDKEEPER_ETCD" ] || missing="$$missing etcd-server";
CHECK_ETCDCTL = command -v etcdctl >/dev/null || missing="$$missing etcd-client";
# ZooKeeper, etcd, a JRE and PostgreSQL 15 (the history tests start a throwaway server
# with its initdb/pg_ctl) come from Debian packages; install only what is missing.
# docker-compose (v1) only validates docker-compose.yml offline (tests/test_compose.py):
# no Docker engine is needed, so its recommended docker.io is not installed.
# openssl runs the certificate recipe of docs/security.md (tests/registry/test_tls.py).
# chromium and chromium-driver run the console's browser tests (tests/console/), headless:
# their recommended packages are not needed either.
SYSTEM_CHECKS = $(CHECK_ZOOKEEPER) $(CHECK_ETCD) $(CHECK_ETCDCTL) $(CHECK_JAVA) \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	command -v openssl >/dev/null || missing="$$missing openssl"; \
	[ -x /usr/lib/postgresql/15/bin/initdb ] || missing="$$missing postgresql-15"; \
	command -v docker-compose >/dev/null || bare="$$bare docker-compose"; \
	command -v chromium >/dev/null || bare="$$bare chromium"; \
	command -v chromedriver >/dev/null || bare="$$bare chromium-driver";
# the demo and `make registry-up` need only their BACKEND's store: etcd is one binary;
# ZooKeeper needs a JRE. No PostgreSQL, browser or JRE for BACKEND=etcd.
DEMO_CHECKS_etcd = $(CHECK_ETCD)
DEMO_CHECKS_zookeeper = $(CHECK_ZOOKEEPER) $(CHECK_JAVA)

# $(call apt_install,CHECKS): run CHECKS, then apt-get install what they found missing
# (as root, or with password-less sudo; otherwise print the line to run and fail)
define apt_install
	@missing=""; bare=""; \
	$(1) \
	if [ -n "$$missing$$bare" ]; then \
	  echo "installing system packages:$$missing$$bare"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=""; \
	  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO="sudo -n"; \
	  else echo "cannot install system packages: run as root:"; \
	       echo "  apt-get update && apt-get install -y$$missing$$bare"; exit 1; fi; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  $$SUDO apt-get update -qq \
	  && { [ -z "$$missing" ] || $$SUDO apt-get install -y -qq$$missing >/dev/null; } \
	  && { [ -z "$$bare" ] || $$SUDO apt-get install -y -qq --no-install-recommends$$bare >/dev/null; }; \
	fi
endef

# everything the test suite needs (make test, chaos, bench)
system-deps:
	$(call apt_install,$(SYSTEM_CHECKS))

# what the demo's BACKEND needs, nothing else
demo-deps:
	@case "$(BACKEND)" in etcd|zookeeper) ;; \
	  *) echo "BACKEND=$(BACKEND): valid backends are etcd and zookeeper"; exit 2;; esac
	$(call apt_install,$(DEMO_CHECKS_$(BACKEND)))

venv: $(STAMP)

# the demo's packages only: the CLI and its BACKEND's client (newcomer review N23: the
# full set, every extra and the dev group, took most of a first `make demo`); a venv
# that `make test` filled already has them
DEMO_EXTRAS_etcd := cli,etcd
DEMO_EXTRAS_zookeeper := cli
DEMO_STAMP := $(VENV)/.demo-$(BACKEND)
demo-venv: $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml constraints.txt
	@case "$(BACKEND)" in etcd|zookeeper) ;; \
	  *) echo "BACKEND=$(BACKEND): valid backends are etcd and zookeeper"; exit 2;; esac
	test -x $(PY) || python3 -m venv $(VENV)
	if [ ! -f $(STAMP) ] || [ $(STAMP) -ot pyproject.toml ]; then \
	  $(PY) -m pip install -q --upgrade 'pip>=25.1' \
	  && $(PY) -m pip install -q -c constraints.txt -e '.[$(DEMO_EXTRAS_$(BACKEND))]'; fi
	touch $(DEMO_STAMP)

# every extra and the dev group at the tested versions (constraints.txt), as CI runs
# it; pip >= 25.1 reads dependency groups (--group)
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade 'pip>=25.1'
	$(PY) -m pip install -q -c constraints.txt $(INSTALL_DEV)
	touch $(STAMP)

registry-up: demo-deps venv
	$(PY) -m shardkeeper.cli registry up --backend $(BACKEND)

registry-down: venv
	$(PY) -m shardkeeper.cli registry down

clean:
	rm -rf $(VENV) $(LATEST_VENV) $(foreach v,$(OTHER_PYTHONS),.venv-$(v)) registry/data .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
