# bergstream's image: the routers, the backfill, and the Spark master and worker of docker-compose.yml all
# run from it. It holds bergstream with its Python dependencies and the jars pinned in
# core/src/bergstream/jvm/pom.xml, resolved at build time; nothing is fetched when a container starts.
#
#   docker build -t bergstream:latest .
#   docker run --rm bergstream:latest bergstream jars versions
#
# Where the engine cannot pull debian:bookworm-slim, make a base image from Debian's packages first:
#   sh deploy/docker/base-image.sh && docker build --build-arg BASE_IMAGE=bergstream/debian:bookworm -t bergstream .
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${BASE_IMAGE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv openjdk-17-jdk-headless maven \
    && rm -rf /var/lib/apt/lists/*
ENV BERGSTREAM_CACHE=/opt/bergstream/cache \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# Dependencies first, then the pinned jars (and the Spark that bergstream's Java compiles against), then
# bergstream itself, whose wheel build compiles that Java with Maven: a change to bergstream's code rebuilds
# only the last layers.
COPY pyproject.toml constraints*.txt ./
RUN python3 -m venv /opt/bergstream/venv \
    && /opt/bergstream/venv/bin/pip install -q --upgrade pip \
    && python3 -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['postgres']))" > /tmp/requirements.txt \
    && if [ -f constraints.txt ]; then set -- -c constraints.txt; fi \
    && /opt/bergstream/venv/bin/pip install -q "$@" -r /tmp/requirements.txt
COPY core/src/bergstream/jvm/pom.xml core/src/bergstream/jvm/pom.xml
RUN for jars in spark kafka; do \
        mvn -q -B -f core/src/bergstream/jvm/pom.xml -P "$jars" dependency:copy-dependencies -DincludeScope=runtime \
            -DoutputDirectory="/tmp/warm/$jars" || exit 1; \
    done && rm -rf /tmp/warm
COPY . .
RUN if [ -f constraints.txt ]; then set -- -c constraints.txt; fi \
    && /opt/bergstream/venv/bin/pip install -q --no-deps "$@" . \
    && /opt/bergstream/venv/bin/bergstream jars resolve \
    && ln -s "$(/opt/bergstream/venv/bin/python -c 'import bergstream.deploy.render as r; print(r.SUBMIT_ENTRY)')" \
        /opt/bergstream/submit.py \
    && chmod -R a+rX /opt/bergstream

FROM ${BASE_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 openjdk-17-jre-headless procps tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --create-home --home-dir /home/bergstream bergstream \
    && install -d -o bergstream -g bergstream /var/lib/bergstream
COPY --from=build /opt/bergstream /opt/bergstream
# The settings of deploy/topics and deploy/apps where `bergstream` looks for them by default: under the
# working folder. Deployments mount their own and name them with --config.
COPY --chown=10001:10001 deploy/topics /var/lib/bergstream/deploy/topics
COPY --chown=10001:10001 deploy/apps /var/lib/bergstream/deploy/apps
ENV PATH=/opt/bergstream/venv/bin:$PATH \
    BERGSTREAM_CACHE=/opt/bergstream/cache \
    PYTHONUNBUFFERED=1
USER bergstream
WORKDIR /var/lib/bergstream
# Spark on Kubernetes starts the executor pods of a router (and a SparkApplication's driver pod) from this
# image with `executor` or `driver` and its settings in the environment: bergstream.deploy.pod turns them
# into the JVM and spark-submit commands of the image's Spark. Any other command runs as given.
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/bergstream/venv/bin/python", "-m", "bergstream.deploy.pod"]
CMD ["bergstream", "--help"]
