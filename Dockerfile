# relmon container image. Two stages: the wheel is built and installed into a virtualenv
# in the first, and only that virtualenv is copied into a slim runtime image, so no
# compiler or build tool ends up in the final image. Runs as a non-root user.
# No image is published yet: build it and push it to your registry (README, "Run it on
# Kubernetes"):
#   docker build -t registry.example.com/relmon:0.1.0 .
#   docker push registry.example.com/relmon:0.1.0
#   docker run --rm -p 127.0.0.1:9108:9108 \
#     -v $PWD/relmon.yaml:/etc/relmon/config/relmon.yaml:ro registry.example.com/relmon:0.1.0
# Linted by hadolint in the tests (tests/deploy/test_dockerfile.py).
# The build stage is the full Python image (it has gcc): the wheel compiles the traffic
# port's hot path with mypyc (setup.py, RELMON_COMPILE=1); mypy stays in this stage.
FROM python:3.11 AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY monitor ./monitor
COPY adapters ./adapters
RUN pip install mypy==2.4.1 setuptools==84.2.1 wheel==0.45.1 \
 && RELMON_COMPILE=1 pip wheel --no-build-isolation --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/relmon \
 && /opt/relmon/bin/pip install --no-compile /wheels/relmon-*.whl

FROM python:3.11-slim
LABEL org.opencontainers.image.title="relmon" \
      org.opencontainers.image.description="Conformal reliability monitoring for LLMs in production" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/relmon/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    RELMON_STATE_DIR=/var/lib/relmon
RUN groupadd --system --gid 10001 relmon \
 && useradd --system --uid 10001 --gid relmon --home-dir /var/lib/relmon --shell /usr/sbin/nologin relmon \
 && mkdir -p /var/lib/relmon /etc/relmon/config \
 && chown relmon:relmon /var/lib/relmon
COPY --from=build /opt/relmon /opt/relmon
USER 10001:10001
EXPOSE 9108 9109 9110
VOLUME ["/var/lib/relmon"]
ENTRYPOINT ["relmon"]
CMD ["run", "--config", "/etc/relmon/config/relmon.yaml"]
