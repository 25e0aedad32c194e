# The service image: API and worker (choose with the command: `gate api` / `gate worker`).
# The worker talks to the host's Docker engine through the mounted socket; the API never does.
#
# Build with BuildKit (the default of `docker compose` v2 and `docker buildx build`; with the
# classic `docker build` set DOCKER_BUILDKIT=1):
#
#   docker build -t gate-service:latest .
#
# Behind a TLS-intercepting proxy, pip needs the proxy's CA to reach the package index. Pass
# a PEM bundle as the OPTIONAL build secret `extra_ca`; it is appended to the system bundle
# for the pip step only and never stored in a layer:
#
#   docker build --secret id=extra_ca,src=/path/to/corporate-ca.pem -t gate-service:latest .
#
# (compose v2: `build: {secrets: [extra_ca]}` plus a top-level `secrets: {extra_ca: {file: ...}}`.)
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
# debootstrap lets a worker with no registry access bootstrap the runner's base image.
RUN apt-get update \
 && apt-get install -y --no-install-recommends debootstrap ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# A regular (non-editable) install pinned by the lock. The sources are bind-mounted for this
# step only, so none of them (nor the CA) stays in the image: the package, its migrations and
# the runner's sources are all in the installed wheel.
RUN --mount=type=bind,target=/src,rw \
    --mount=type=secret,id=extra_ca,required=false \
    set -eu; \
    if [ -s /run/secrets/extra_ca ]; then \
      cat /etc/ssl/certs/ca-certificates.crt /run/secrets/extra_ca > /tmp/gate-ca.pem; \
      export PIP_CERT=/tmp/gate-ca.pem; \
    fi; \
    pip install --no-cache-dir --disable-pip-version-check --no-input \
        -c /src/requirements.lock /src; \
    rm -f /tmp/gate-ca.pem; \
    useradd --system --uid 10000 gate
ENV GATE_DATA_DIR=/var/lib/gate GATE_HOST=0.0.0.0 PYTHONUNBUFFERED=1
RUN mkdir -p /var/lib/gate && chown gate /var/lib/gate
WORKDIR /var/lib/gate
EXPOSE 8080
CMD ["gate", "api"]
