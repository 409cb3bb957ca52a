#!/usr/bin/env bash
# Installs everything DelayService needs on a fresh machine, idempotently:
# Debian packages (Java, Maven; with TEST_TOOLS=1 also the Prometheus server and the
# compose linter from npm), a virtualenv in .venv with the package and its extras, and
# the cached jars of the local Kafka broker and of Spark's Kafka connector.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
packages=()
command -v java >/dev/null || packages+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || packages+=(maven)
if [ "${TEST_TOOLS:-0}" = 1 ]; then
  command -v prometheus >/dev/null || packages+=(prometheus)
  command -v openssl >/dev/null || packages+=(openssl)  # PEM fixtures of the audit's TLS test
  command -v npm >/dev/null || packages+=(nodejs npm)
  # Moves one daemon's clock in the fault suite (scenario 22: a host clock ahead).
  [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || [ -e /usr/lib/faketime/libfaketime.so.1 ] \
    || packages+=(libfaketime)
fi
if [ ${#packages[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${packages[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
echo "setup: installing Python packages into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test,audit]"

if [ "${TEST_TOOLS:-0}" = 1 ] && ! command -v dclint >/dev/null; then
  echo "setup: installing dclint (compose linter) from npm"
  $sudo npm install -g --silent dclint@3.1.0 >/dev/null
fi

echo "setup: caching the Kafka broker jars (Maven Central)"
.venv/bin/python -c "from delayservice.testing.local_broker import ensure_jars; print(ensure_jars())"
echo "setup: caching the Spark Kafka connector jars (Maven Central)"
.venv/bin/python -c "from delayservice.audit.jars import connector_jars; print(len(connector_jars()), 'jars')"
