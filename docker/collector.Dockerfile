# syntax=docker/dockerfile:1
# ragtrace collector image.  Build from the repository root:
#   docker build -f docker/collector.Dockerfile -t ragtrace-collector .
#
# Base image: pinned by its full version tag.  A sha256 digest would pin it exactly,
# but it cannot be looked up offline where this file was written; replace the tag with
# `python:3.11.11-slim-bookworm@sha256:<digest>` (see `docker buildx imagetools inspect`)
# in your own registry mirror.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ----------------------------------------------------------------------------- build
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PROJECT_ENVIRONMENT=/opt/venv
# uv itself, pinned with hashes.
COPY tools/uv.lock.txt /tmp/uv.lock.txt
RUN pip install --no-cache-dir --require-hashes -r /tmp/uv.lock.txt
WORKDIR /src
# Third-party dependencies first (cached while only our code changes), exactly as locked
# in uv.lock, hashes verified.
COPY pyproject.toml uv.lock README.md ./
COPY collector/pyproject.toml collector/pyproject.toml
RUN uv sync --frozen --no-dev --package ragtrace-collector --no-install-workspace \
        --python /usr/local/bin/python3.11
# Then the SDK and the collector themselves, installed non-editable into the venv.
COPY ragtrace ragtrace
COPY collector/ragtrace_collector collector/ragtrace_collector
RUN uv sync --frozen --no-dev --package ragtrace-collector --no-editable \
        --python /usr/local/bin/python3.11

# --------------------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True
RUN groupadd --system --gid 10001 ragtrace \
    && useradd --system --uid 10001 --gid ragtrace --no-create-home --shell /usr/sbin/nologin ragtrace \
    && install -d -o 10001 -g 10001 /var/lib/ragtrace
COPY --from=build /opt/venv /opt/venv
COPY docker/collector.yaml /etc/ragtrace/collector.yaml
# The only writable place: relative paths in the config (a file exporter, say) land here.
WORKDIR /var/lib/ragtrace
USER 10001:10001
# OTLP gRPC, OTLP HTTP, admin (/metrics, /healthz, /readyz)
EXPOSE 4317 4318 8888
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8888/healthz', timeout=4)"]
# SIGTERM: stop receiving, finish in-flight evaluations, flush buffered spans, exit.
STOPSIGNAL SIGTERM
ENTRYPOINT ["ragtrace-collector"]
CMD ["serve", "--config", "/etc/ragtrace/collector.yaml"]
