#!/usr/bin/env bash
# Runs the built image's migrate and web commands as its own user (uid 10001) and asks /healthz and /readyz:
# the check `podman run` would be, where podman cannot run containers. On the machine this recipe was
# written on, crun refuses every container ("cgroups in hybrid mode not supported, drop all controllers
# from cgroupv2"), so this mounts a container's root and runs the commands in it with chroot instead
# (the host's network; embedded SQLite in the container's own /var/lib/openrelay).
set -euo pipefail
IMAGE=${IMAGE:-localhost/openrelay:latest}
container=$(podman create "$IMAGE")
root=$(podman mount "$container")
cleanup() {
  umount -l "$root/proc" "$root/dev/shm" "$root/dev" 2>/dev/null || true
  podman umount "$container" >/dev/null || true
  podman rm -f "$container" >/dev/null || true
}
trap cleanup EXIT
mount --bind /dev "$root/dev"
mount -t proc proc "$root/proc"
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"  # multiprocessing's semaphores (the worker)
chroot --userspec=10001:10001 "$root" /usr/bin/env -i PATH=/opt/openrelay/bin:/usr/bin:/bin PYTHONPATH=/app \
  OPENRELAY_DATA_DIR=/var/lib/openrelay HOME=/var/lib/openrelay OPENRELAY_DEV_KEY_NOTED=1 sh -ec '
  cd /app
  test "$(id -u)" = 10001
  python manage.py migrate --noinput >/dev/null
  uvicorn --host 127.0.0.1 --port 18765 --http openrelay.web.webserver:HttpToolsProtocol openrelay.asgi:application \
    >/dev/null 2>&1 &
  web=$!
  python - <<PY
import time, urllib.request
for _ in range(150):
    try:
        print(urllib.request.urlopen("http://127.0.0.1:18765/healthz").read().decode(),
              urllib.request.urlopen("http://127.0.0.1:18765/readyz").read().decode())
        break
    except OSError:
        time.sleep(0.2)
else:
    raise SystemExit("the web never answered /healthz")
PY
  kill $web; wait $web || true
  # The worker: started, then stopped by SIGTERM as a runtime stops it; it must exit 0.
  python manage.py qcluster > /tmp/worker.log 2>&1 & worker=$!
  for _ in $(seq 100); do grep -q "running" /tmp/worker.log && break; sleep 0.2; done
  kill -TERM $worker || { cat /tmp/worker.log; exit 1; }; wait $worker
  echo "migrate, web and worker ran as uid $(id -u)"
'
