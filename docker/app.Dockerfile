# syntax=docker/dockerfile:1
# The example RAG app (examples/support_bot).  Build from the repository root:
#   docker build -f docker/app.Dockerfile -t ragtrace-support-bot .
#
# Base image pinned by full version tag (a sha256 digest could not be looked up offline;
# pin one in your own mirror).
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    UV_PYTHON_DOWNLOADS=never \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PROJECT_ENVIRONMENT=/opt/venv
COPY tools/uv.lock.txt /tmp/uv.lock.txt
RUN pip install --no-cache-dir --require-hashes -r /tmp/uv.lock.txt
WORKDIR /src
# The SDK plus the "examples" dependency group (rank-bm25, litellm), as locked in uv.lock.
COPY pyproject.toml uv.lock README.md ./
COPY collector/pyproject.toml collector/pyproject.toml
RUN uv sync --frozen --no-dev --group examples --package ragtrace-sdk --no-install-workspace \
        --python /usr/local/bin/python3.11
COPY ragtrace ragtrace
RUN uv sync --frozen --no-dev --group examples --package ragtrace-sdk --no-editable \
        --python /usr/local/bin/python3.11

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    OTEL_SERVICE_NAME=support-bot
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --no-create-home --shell /usr/sbin/nologin app
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY examples examples
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
ENTRYPOINT ["python", "-m", "examples.support_bot"]
# Serve POST /ask and POST /fault on :8000 and play steady traffic in the background.
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--traffic", "--interval", "1"]
