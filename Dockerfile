# syntax=docker/dockerfile:1
# DelayService: the forwarding daemon that runs beside each Kafka broker.
#
#   docker build -t delayservice .
#   docker run --rm -e DELAYSERVICE_BOOTSTRAP_SERVERS=broker:9092 -p 9480:9480 delayservice
#
# Configuration comes only from the settings: DELAYSERVICE_* environment variables, or a
# TOML file mounted into the container and named by DELAYSERVICE_CONFIG, e.g.
#   -v "$PWD/config/delayservice.toml:/etc/delayservice/delayservice.toml:ro"
#   -e DELAYSERVICE_CONFIG=/etc/delayservice/delayservice.toml

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: a virtualenv with the package and its dependencies ---------------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# A C compiler builds the compiled fast path (setup.py, Cython); only this stage has it.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
RUN python -m venv /opt/delayservice
COPY pyproject.toml setup.py README.md ./
COPY delayservice ./delayservice
RUN /opt/delayservice/bin/pip install . \
    && /opt/delayservice/bin/python -c "from delayservice.forward import speedups; assert speedups.compiled_fast_path()"

# ---- runtime: the virtualenv only, run as an unprivileged user ---------------------
FROM ${PYTHON_IMAGE}

LABEL org.opencontainers.image.title="delayservice" \
      org.opencontainers.image.description="Delayed delivery for Apache Kafka: the forwarding daemon" \
      org.opencontainers.image.licenses="Apache-2.0"

RUN groupadd --system --gid 10001 delayservice \
    && useradd --system --uid 10001 --gid delayservice --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin delayservice \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/delayservice

# Precise mode's slot files (settings.data_dir); keep them on a volume, they are the
# only copy of what the wheel holds.
VOLUME ["/var/lib/delayservice"]

COPY --from=build /opt/delayservice /opt/delayservice

ENV PATH=/opt/delayservice/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

USER 10001:10001
WORKDIR /tmp

# /metrics, /healthz and /readyz (settings.metrics_port).
EXPOSE 9480

# Ready means: the broker answers and every level's threads run. `check` reads the
# settings `run` reads (DELAYSERVICE_CONFIG, DELAYSERVICE_METRICS_PORT, metrics_host),
# so the probe follows a changed port.
HEALTHCHECK --interval=15s --timeout=10s --start-period=60s --retries=3 \
    CMD ["delayservice", "check", "--timeout", "5"]

# Exec form: the daemon is PID 1 and receives SIGTERM itself; it commits what is safe,
# flushes and leaves the consumer group within settings.shutdown_timeout_s (30 s), so
# give `docker stop` more than that (`--time 40`, or compose's stop_grace_period).
ENTRYPOINT ["delayservice"]
CMD ["run"]
STOPSIGNAL SIGTERM
