# The one image every pipeline stage and the trainer/rollout pods run: asyncrl with TPU JAX.
# The base image comes pinned by digest from images/base-images.txt; build from the repository
# root:
#   docker build $(python3 images/pins.py build-args) -f images/runtime.Dockerfile \
#     -t REGION-docker.pkg.dev/PROJECT/asyncrl/runtime:0.1.0 .
# and reference the pushed image by digest in cluster.image (asyncrl pipeline compile records it).
ARG PYTHON_BASE

FROM ${PYTHON_BASE} AS build
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY asyncrl ./asyncrl
RUN pip install --no-cache-dir --prefix=/install -c constraints.txt . \
 && pip install --no-cache-dir --prefix=/install "jax[tpu]==0.10.2" \
      -f https://storage.googleapis.com/jax-releases/libtpu_releases.html

FROM ${PYTHON_BASE}
COPY --from=build /install /usr/local
RUN useradd --uid 1000 --create-home --shell /usr/sbin/nologin asyncrl
USER 1000:1000
WORKDIR /home/asyncrl
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
ENTRYPOINT ["asyncrl"]
