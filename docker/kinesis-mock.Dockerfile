# kinesis-mock (npm `kinesis-local`, pinned by packaging/kinesis-mock/package-lock.json), the Kinesis
# emulator of the stack; built from the repository root (see .dockerignore). Configured through its
# environment (docker-compose.yaml): KINESIS_MOCK_PLAIN_PORT, INITIALIZE_STREAMS, LOG_LEVEL, ...
FROM node:20-bookworm-slim

WORKDIR /opt/kinesis-mock
COPY packaging/kinesis-mock/package.json packaging/kinesis-mock/package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund --loglevel=error \
    && npm cache clean --force
COPY docker/kinesis-mock-healthcheck.js /usr/local/lib/kinesis-mock-healthcheck.js
# Where streams persist (SHOULD_PERSIST_DATA): a new named volume takes this folder's owner.
RUN install -d -o node -g node /var/lib/kinesis-mock

USER node
# It must run from its package folder: it reads its TLS certificate (server.json) from there.
WORKDIR /opt/kinesis-mock/node_modules/kinesis-local
EXPOSE 4568
CMD ["node", "main.js"]
