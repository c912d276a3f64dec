# pgfence: `pgfence run` in a container.
#
#   docker build -t pgfence:0.2.0 .
#   docker run --rm --read-only --tmpfs /run/pgfence --tmpfs /tmp \
#     --env-file pgfence.env --stop-timeout 45 -p 9464:9464 pgfence:0.2.0
#   (podman: --tmpfs /run/pgfence:U, or the tmpfs is root's; .ci/container)
#
# PGFENCE_DSN comes from the environment at run time (--env-file, a Secret),
# never from the image.  /run/pgfence holds the Prometheus multiprocess files:
# mount a tmpfs there (--tmpfs /run/pgfence, a Memory emptyDir on Kubernetes).
# Docker's default stop timeout is 10 s, shorter than the 30 s drain:
# give --stop-timeout (or stop_grace_period) above PGFENCE_GRACEFUL_TIMEOUT.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/pgfence
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY supervisor ./supervisor
COPY handlers ./handlers
COPY sql ./sql
# The path users take and CI checks (.ci/wheel-smoke): build a wheel, then
# install that wheel, not the source tree, so the image runs pgfence exactly
# as `pip install pgfence` would lay it out.
RUN /opt/pgfence/bin/pip wheel --no-deps --wheel-dir /dist .
# The wheel is the only file in /dist; its name carries the version.
RUN /opt/pgfence/bin/pip install /dist/pgfence-*.whl

FROM python:3.11-slim
# The same path as the systemd unit's /opt/pgfence venv.
COPY --from=build /opt/pgfence /opt/pgfence
RUN groupadd --system --gid 10001 pgfence \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin pgfence \
 && install -d -o 10001 -g 10001 -m 0700 /run/pgfence
ENV PATH=/opt/pgfence/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PGFENCE_METRICS_DIR=/run/pgfence \
    PGFENCE_METRICS_HOST=0.0.0.0 \
    PGFENCE_METRICS_PORT=9464
USER 10001:10001
WORKDIR /opt/pgfence
EXPOSE 9464
# TERM drains (exit 0); the arbiter is PID 1 and reaps its own children.
STOPSIGNAL SIGTERM
# /healthz is 200 while the arbiter's loop ticks; the database is /readyz's
# business, so a database outage does not mark the container unhealthy.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=6 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PGFENCE_METRICS_PORT', '9464'), timeout=4)"]
ENTRYPOINT ["pgfence"]
CMD ["run"]
