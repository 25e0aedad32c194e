# The service image: API and worker (choose with the command: `gate api` / `gate worker`).
# The worker talks to the host's Docker engine through the mounted socket; the API never does.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}
# debootstrap lets a worker with no registry access bootstrap the runner's base image.
RUN apt-get update \
 && apt-get install -y --no-install-recommends debootstrap ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY gate_service/ gate_service/
COPY runner_image/ runner_image/
COPY migrations/ migrations/
RUN pip install --no-cache-dir --disable-pip-version-check -e . \
 && useradd --system --uid 10000 gate
ENV GATE_DATA_DIR=/var/lib/gate GATE_HOST=0.0.0.0 PYTHONUNBUFFERED=1
RUN mkdir -p /var/lib/gate && chown gate /var/lib/gate
EXPOSE 8080
CMD ["gate", "api"]
