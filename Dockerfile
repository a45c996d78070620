# One image for every control-plane role (worker, beat, flower, CLI). The trainer runs on the
# rented hosts, inside the job's own image; this image never trains.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HUB_OFFLINE=1 \
    TUNEHARNESS_HOME=/var/lib/tuneharness

RUN apt-get update \
 && apt-get install -y --no-install-recommends openssh-client \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --create-home --home-dir /var/lib/tuneharness tuneharness

WORKDIR /srv/tuneharness
COPY pyproject.toml README.md beat_schedule.py ./
COPY app ./app
COPY workers ./workers
COPY providers ./providers
COPY trainer ./trainer
COPY gate ./gate
RUN pip install 'torch==2.13.0' --index-url https://download.pytorch.org/whl/cpu \
 && pip install .

USER tuneharness
ENTRYPOINT ["tuneharness"]
CMD ["doctor"]
