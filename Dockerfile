# The example service (examples/embedded_service.py) on the shardkeeper package.
#
#   docker build -t shardkeeper-example .
#   docker-compose up --scale worker=5      # see docker-compose.yml
#
# Two stages: `etcd` is a plain etcd server from Debian's package (the version the
# test suite runs against), used by docker-compose.yml; the last stage, the default
# target, is the worker image.

FROM debian:bookworm-slim AS etcd
RUN apt-get update \
    && apt-get install -y --no-install-recommends etcd-server etcd-client \
    && rm -rf /var/lib/apt/lists/*
EXPOSE 2379
CMD ["etcd", "--name", "etcd", "--data-dir", "/var/lib/etcd", \
     "--listen-client-urls", "http://0.0.0.0:2379", \
     "--advertise-client-urls", "http://etcd:2379"]


FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# The package first, so that editing an example does not re-install dependencies.
# (README.md* : the readme is optional for the build.)
COPY pyproject.toml README.md* constraints.txt ./
COPY src ./src
RUN pip install -c constraints.txt '.[etcd]' && rm -rf src

COPY examples ./examples
RUN useradd --create-home --uid 10001 shardkeeper
USER shardkeeper

ENV PORT=8080
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{os.environ['PORT']}/healthz\", timeout=2)"]

# exec form: python is PID 1 and gets SIGTERM itself (graceful stop, see the service)
CMD ["python", "examples/embedded_service.py"]
