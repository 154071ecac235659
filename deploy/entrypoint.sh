#!/bin/sh
# The platform image's entry point (deploy/Dockerfile): one image, the role chosen by command.
#   web              daphne (HTTP + websockets) on 0.0.0.0:${PORT:-8000}, behind a TLS proxy
#   worker           a django-q2 worker cluster (manage.py qcluster); run one per machine
#   offline-model    the offline scripted model on 0.0.0.0:${OFFLINE_MODEL_PORT:-8765}
#   migrate          apply migrations (and register the scheduled jobs), then exit
#   manage ARGS...   any manage.py command, e.g. `manage bootstrap_admin admin --password-env P`
#   anything else    run as given (a shell for debugging)
set -eu
cd /opt/trajplatform

case "${1:-web}" in
  web)
    exec daphne -b 0.0.0.0 -p "${PORT:-8000}" --proxy-headers trajplatform.asgi:application ;;
  worker)
    exec python manage.py qcluster ;;
  offline-model)
    exec python manage.py offline_model --host 0.0.0.0 --port "${OFFLINE_MODEL_PORT:-8765}" ;;
  migrate)
    exec python manage.py migrate --no-input ;;
  manage)
    shift
    exec python manage.py "$@" ;;
  *)
    exec "$@" ;;
esac
